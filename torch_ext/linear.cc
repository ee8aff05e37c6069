// Python bindings of the FP8 Linear: the LinearState class and
// linear_forward.
#include "linear.h"

#include <vector>

#include "descriptors.h"
#include "linear_autograd.h"
#include "linear_recipe.h"
#include "linear_state.h"

namespace py = pybind11;

namespace fp8kit_torch {

void register_linear(py::module_& m) {
  py::class_<LinearState, c10::intrusive_ptr<LinearState>>(
      m, "LinearState",
      "One fp8kit Linear layer's FP8 scaling state (delayed-scaling history, amax, scale and "
      "scale_inv of its input, weight and grad_output) and its cached quantized weight.")
      .def(py::init([](py::handle recipe, const at::Device& device) {
             return make_linear_state(recipe_from_python(recipe), device);
           }),
           py::arg("recipe"), py::arg("device") = at::Device(at::kCPU),
           "The state for `recipe` (an fp8kit.recipe.DelayedScaling or CurrentScaling) on "
           "`device`.")
      .def_static("from_state", &LinearState::from_checkpoint, py::arg("state"),
                  py::arg("device") = at::Device(at::kCPU),
                  "The state that get_state() described, on `device`.")
      .def(
          "use_recipe",
          [](LinearState& s, py::handle recipe) {
            const LinearRecipe r = recipe_from_python(recipe);
            const auto lock = lock_state(s.mu);
            if (!r.same_scaling(s.recipe)) return false;
            s.recipe.forward_fast_accumulation = r.forward_fast_accumulation;
            return true;
          },
          py::arg("recipe"),
          "Takes `recipe`'s forward_fast_accumulation and returns True when its scaling "
          "parameters are this state's; returns False (and changes nothing) otherwise.")
      .def_property_readonly(
          "recipe", [](const LinearState& s) { return recipe_to_plain(s.recipe); },
          "The scaling parameters, as plain values.")
      .def_property_readonly("delayed", [](const LinearState& s) { return s.recipe.delayed; })
      .def_property_readonly(
          "forward_fast_accumulation",
          [](const LinearState& s) { return s.recipe.forward_fast_accumulation; },
          "Fast (native-precision) accumulation in the forward GEMM: the recipe's "
          "forward_fast_accumulation.")
      .def_property_readonly("device", [](const LinearState& s) { return s.device; })
      .def_property_readonly("non_tn", [](const LinearState& s) { return s.non_tn; })
      .def_property_readonly("amax_history", [](const LinearState& s) { return s.history; })
      .def_property_readonly("amax", [](const LinearState& s) { return s.amax; })
      .def_property_readonly("scale", [](const LinearState& s) { return s.scale; })
      .def_property_readonly("scale_inv", [](const LinearState& s) { return s.scale_inv; })
      .def_property_readonly("seeded", [](LinearState& s) {
        const auto lock = lock_state(s.mu);
        return std::vector<bool>(s.seeded.begin(), s.seeded.end());
      })
      .def_property(
          "cache_weight", [](const LinearState& s) { return s.cache_weight; },
          [](LinearState& s, bool v) {
            const auto lock = lock_state(s.mu);
            s.cache_weight = v;
            if (!v) s.clear_weight_cache();
          },
          "Reuse the quantized weight while the weight tensor is unchanged (same tensor, "
          "storage and version counter). Off by default: a write through weight.data does "
          "not bump the version counter and would leave a stale FP8 weight.")
      .def_property_readonly("weight_cache_valid",
                             [](const LinearState& s) { return s.w_src.defined(); })
      .def("clear_weight_cache", [](LinearState& s) {
        const auto lock = lock_state(s.mu);
        s.clear_weight_cache();
      })
      .def("to", [](LinearState& s, const at::Device& device) {
        const auto lock = lock_state(s.mu);
        s.move_to(device);
      }, py::arg("device"), "Moves the state to `device` in place.")
      .def("get_state", &LinearState::checkpoint,
           "The recipe as plain values, CPU copies of the state tensors and the seeded flags "
           "(for extra_state).");

  m.def("linear_forward", &linear_forward, py::arg("state"), py::arg("input"), py::arg("weight"),
        py::arg("bias") = py::none(),
        "FP8 y = input @ weight.T + bias with autograd (FP8 dgrad and wgrad), per `state`.");
}

}  // namespace fp8kit_torch
