// Python bindings of the FP8 Linear: the LinearState class and
// linear_forward.
#include "linear.h"

#include <string>
#include <vector>

#include "descriptors.h"
#include "errors.h"
#include "initialised.h"
#include "linear_autograd.h"
#include "linear_recipe.h"
#include "linear_state.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

constexpr ClassHint kStateHint{
    "fp8kit._torch_ext.LinearState",
    "LinearState(recipe, device) (or use fp8kit.torch.Linear, which makes its own)"};

LinearState& state_self(py::handle self) { return initialised<LinearState>(self, kStateHint); }

// A state tensor for Python: a copy, so that resizing or re-typing it
// cannot corrupt the layer's state (which the core writes in place).
at::Tensor copy_out(LinearState& s, const at::Tensor& t) {
  const auto lock = lock_state(s.mu);
  return t.clone();
}

}  // namespace

FP8Weight read_fp8_weight(py::handle t, const char* fn) {
  FP8KIT_TYPE_CHECK(PyTuple_Check(t.ptr()) && PyTuple_GET_SIZE(t.ptr()) == 3, fn,
                    ": fp8_weight is ", value_str(t), "; pass (data, columnwise_data, scale_inv)");
  auto item = [&](int i, const char* name) {
    py::handle v = PyTuple_GET_ITEM(t.ptr(), i);
    return v.is_none() ? at::Tensor() : read_tensor(v, c10::str(fn, ": fp8_weight's ", name));
  };
  FP8Weight w{item(0, "data"), item(1, "columnwise_data"), item(2, "scale_inv")};
  FP8KIT_TYPE_CHECK(w.scale_inv.defined(), fn, ": fp8_weight's scale_inv is None; pass the "
                    "float32 [1] scale_inv of the FP8 weight");
  return w;
}

void register_linear(py::module_& m) {
  py::class_<LinearState, c10::intrusive_ptr<LinearState>>(
      m, "LinearState",
      "One fp8kit Linear layer's FP8 scaling state for one scaling recipe (delayed-scaling "
      "history, amax, scale and scale_inv of its input, weight and grad_output) and its cached "
      "quantized weight.")
      .def(py::init([](py::handle recipe, py::handle device) {
             return make_linear_state(
                 recipe_from_python(recipe),
                 read_device(device, "fp8kit._torch_ext.LinearState: device"));
           }),
           py::arg("recipe"), py::arg("device") = py::str("cpu"),
           "The state for `recipe` (an fp8kit.recipe.DelayedScaling or CurrentScaling) on "
           "`device`.")
      .def_static(
          "from_state",
          [](py::handle state, py::handle device, const std::string& where) {
            return LinearState::from_checkpoint(state, read_device(device, where + ": device"),
                                                where);
          },
          py::arg("state"), py::arg("device") = py::str("cpu"),
          py::arg("where") = "fp8kit._torch_ext.LinearState.from_state",
          "The state that get_state() described, on `device`; errors name the entry after "
          "`where`.")
      .def_property_readonly(
          "recipe", [](py::handle self) { return recipe_to_plain(state_self(self).recipe); },
          "The scaling parameters, as plain values.")
      .def_property_readonly("delayed",
                             [](py::handle self) { return state_self(self).recipe.delayed; })
      .def_property_readonly("device", [](py::handle self) { return state_self(self).device; })
      .def_property_readonly("non_tn", [](py::handle self) { return state_self(self).non_tn; })
      .def_property_readonly(
          "amax_history",
          [](py::handle self) {
            LinearState& s = state_self(self);
            return copy_out(s, s.history);
          },
          "A copy of the amax history [3, amax_history_len] (input, weight, grad_output; column 0 "
          "newest).")
      .def_property_readonly(
          "amax",
          [](py::handle self) {
            LinearState& s = state_self(self);
            return copy_out(s, s.amax);
          },
          "A copy of the amax accumulators [3] (0 between calls).")
      .def_property_readonly(
          "scale",
          [](py::handle self) {
            LinearState& s = state_self(self);
            return copy_out(s, s.scale);
          },
          "A copy of the scales [3].")
      .def_property_readonly(
          "scale_inv",
          [](py::handle self) {
            LinearState& s = state_self(self);
            return copy_out(s, s.scale_inv);
          },
          "A copy of the scale inverses [3].")
      .def_property_readonly(
          "tensors",
          [](py::handle self) {
            LinearState& s = state_self(self);
            const auto lock = lock_state(s.mu);
            return py::make_tuple(s.history, s.amax, s.scale, s.scale_inv, s.counters,
                                  s.seeded_flags);
          },
          "The state tensors themselves, not copies: (amax_history, amax, scale, scale_inv, "
          "counters, seeded), the arguments torch.ops.fp8kit.linear_forward and linear_backward "
          "update in place. A move to another device replaces them.")
      .def_property_readonly("seeded",
                             [](py::handle self) {
                               LinearState& s = state_self(self);
                               const auto lock = lock_state(s.mu);
                               return s.seeded_slots();
                             },
                             "Which slots (input, weight, grad_output) are seeded: a list of 3 "
                             "bools, read from the state's device flags.")
      .def_property(
          "cache_weight", [](py::handle self) { return state_self(self).cache_weight; },
          [](py::handle self, bool v) {
            LinearState& s = state_self(self);
            const auto lock = lock_state(s.mu);
            s.cache_weight = v;
            if (!v) s.clear_weight_cache();
          },
          "Reuse the quantized weight while the weight tensor is unchanged (same tensor, "
          "storage and version counter). Off by default: a write through weight.data does "
          "not bump the version counter and would leave a stale FP8 weight.")
      .def_property_readonly(
          "weight_cache_valid", [](py::handle self) { return state_self(self).w_src.defined(); })
      .def("clear_weight_cache",
           [](py::handle self) {
             LinearState& s = state_self(self);
             const auto lock = lock_state(s.mu);
             s.clear_weight_cache();
           })
      .def(
          "to",
          [](py::handle self, py::handle device) {
            LinearState& s = state_self(self);
            const at::Device d = read_device(device, "fp8kit._torch_ext.LinearState.to: device");
            const auto lock = lock_state(s.mu);
            s.move_to(d);
          },
          py::arg("device"), "Moves the state to `device` in place.")
      .def(
          "get_state", [](py::handle self) { return state_self(self).checkpoint(); },
          "The recipe as plain values and CPU copies of the state: float32 amax_history [3, "
          "amax_history_len], scale [3] and seeded [3], the arrays fp8kit.jax's "
          "DelayedScalingState holds (for extra_state).");

  // The columns of linear_forward's statistics rows (LinearStatistics), in order.
  m.attr("STATISTICS_COLUMNS") = py::make_tuple("amax", "underflow", "saturated", "error_sq",
                                                "norm_sq", "scale_inv", "recorded");
  static_assert(kStatColumns == 7, "STATISTICS_COLUMNS names every column");

  m.def(
      "linear_recipe",
      [](py::handle recipe) {
        bool fast = false;
        const LinearRecipe r = recipe_from_python(recipe, &fast);
        return py::make_tuple(recipe_to_plain(r), fast);
      },
      py::arg("recipe"),
      "Checks `recipe` and returns (its scaling parameters as plain values, its "
      "forward_fast_accumulation): recipes with equal scaling parameters share one state.");
  m.def(
      "linear_forward",
      [](py::handle state, py::handle input, py::handle weight, py::handle bias,
         py::handle fast_accumulation, py::handle fp8_weight, py::handle statistics) {
        constexpr const char* fn = "fp8kit.torch.Linear";
        LinearState& st = state_self(state);
        const at::Tensor x = read_tensor(input, c10::str(fn, ": input"));
        const at::Tensor w = read_tensor(weight, c10::str(fn, ": weight"));
        std::optional<at::Tensor> b;
        if (!bias.is_none()) b = read_tensor(bias, c10::str(fn, ": bias"));
        const bool fast =
            read_bool(fast_accumulation, c10::str(fn, ": recipe.forward_fast_accumulation"));
        const at::Tensor stats = statistics.is_none()
                                     ? at::Tensor()
                                     : read_tensor(statistics, c10::str(fn, ": statistics"));
        if (fp8_weight.is_none()) return linear_forward(st, x, w, b, fast, nullptr, stats);
        const FP8Weight fw = read_fp8_weight(fp8_weight, fn);
        return linear_forward(st, x, w, b, fast, &fw, stats);
      },
      py::arg("state"), py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(),
      py::arg("fast_accumulation") = false, py::arg("fp8_weight") = py::none(),
      py::arg("statistics") = py::none(),
      "FP8 y = input @ weight.T + bias with autograd (FP8 dgrad and wgrad), per `state`; "
      "fast_accumulation: the forward GEMM's (the recipe's forward_fast_accumulation). "
      "fp8_weight: None, or (data, columnwise_data, scale_inv) of the weight already in FP8 "
      "(data or columnwise_data None where the call reads no such copy); the GEMMs read it, "
      "`weight` then gives only the shape, dtype and autograd edge, and the weight's scaling "
      "slot records nothing. statistics: None, or a float32 [3, len(STATISTICS_COLUMNS)] "
      "tensor on the layer's device that this call and its backward fill with their casts' "
      "statistics, a row per slot (fp8kit.torch.inspect reads it; torch_ext/linear_autograd.h "
      "lays it out); the outputs, gradients and scaling state are the same bits either way.");
}

}  // namespace fp8kit_torch
