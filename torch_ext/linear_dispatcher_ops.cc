// The kernels of torch.ops.fp8kit.linear_forward and linear_backward (their
// schemas are in dispatcher_ops.cc): the FP8 Linear's two steps as
// dispatcher ops, which is what torch.compile traces of fp8kit.torch.Linear
// (fp8kit/torch/_traced_linear.py puts them in an autograd.Function). The
// eager layer keeps its one pybind11 call and C++ autograd node
// (linear.cc); both run linear_forward_below_autograd and
// linear_backward_below_autograd, so they compute the same bits.
//
// The layer's scaling state travels as its tensors (LinearState.tensors:
// amax_history, amax, scale, scale_inv, counters, seeded), which both ops
// update in place and whose schemas say so, and its recipe as the plain
// values of LinearState.recipe. What forward keeps for backward comes back
// as four tensors; a copy the plan does not keep is an empty [0] tensor, as
// is a gradient backward does not compute.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "descriptors.h"
#include "errors.h"
#include "linear_autograd.h"
#include "linear_dispatcher_ops.h"

namespace fp8kit_torch {

using Tensor = at::Tensor;

LinearRecipe recipe_of(const char* fn, const std::string& scaling,
                       const std::string& forward_dtype, const std::string& backward_dtype,
                       int64_t amax_history_len, int64_t margin,
                       const std::string& amax_reduction, double amax_epsilon,
                       bool power_2_scale) {
  FP8KIT_VALUE_CHECK(scaling == "delayed" || scaling == "current", fn, ": scaling is '",
                     scaling, "'; use 'delayed' or 'current' (LinearState.recipe['scaling'])");
  LinearRecipe r;
  r.delayed = scaling == "delayed";
  r.forward_dtype = parse_fp8_name(forward_dtype, fn, "forward_dtype");
  r.backward_dtype = parse_fp8_name(backward_dtype, fn, "backward_dtype");
  FP8KIT_VALUE_CHECK(amax_history_len >= 1 && amax_history_len <= FP8KIT_AMAX_HISTORY_LEN_MAX, fn,
                     ": amax_history has ", amax_history_len,
                     " columns; the history length is 1 to ", FP8KIT_AMAX_HISTORY_LEN_MAX);
  FP8KIT_VALUE_CHECK(margin >= 0 && margin <= FP8KIT_MARGIN_MAX, fn, ": margin is ", margin,
                     "; it must be in [0, ", FP8KIT_MARGIN_MAX, "]");
  check_amax_epsilon(fn, amax_epsilon);
  r.amax_history_len = static_cast<int>(amax_history_len);
  r.margin = static_cast<int>(margin);
  r.amax_reduction = parse_amax_reduction(amax_reduction, fn, "amax_reduction");
  r.amax_epsilon = static_cast<float>(amax_epsilon);
  r.power_2_scale = power_2_scale;
  return r;
}

// The layer's state tensors, as a LinearState writes them: float32 [3, H]
// history and float32 [3] amax, scale, scale_inv and seeded, int32 [3]
// counters, all contiguous on one CPU or CUDA device.
void check_state(const char* fn, const Tensor& history, const Tensor& amax, const Tensor& scale,
                 const Tensor& scale_inv, const Tensor& counters, const Tensor& seeded) {
  const std::pair<const char*, const Tensor*> slots[] = {
      {"amax", &amax}, {"scale", &scale}, {"scale_inv", &scale_inv}, {"seeded", &seeded},
      {"counters", &counters}};
  check_dense(fn, "amax_history", history);
  FP8KIT_VALUE_CHECK(history.scalar_type() == at::kFloat && history.dim() == 2 &&
                         history.size(0) == kSlots && history.is_contiguous(),
                     fn, ": amax_history is ", dtype_str(history.scalar_type()), " of shape ",
                     shape_str(history.sizes()), "; pass the layer's state tensors "
                     "(LinearState.tensors): a contiguous float32 [3, amax_history_len]");
  device_type_of(history, fn, "amax_history");
  for (const auto& [name, t] : slots) {
    check_dense(fn, name, *t);
    const at::ScalarType want = t == &counters ? at::kInt : at::kFloat;
    FP8KIT_VALUE_CHECK(t->scalar_type() == want && t->dim() == 1 && t->size(0) == kSlots &&
                           t->is_contiguous(),
                       fn, ": ", name, " is ", dtype_str(t->scalar_type()), " of shape ",
                       shape_str(t->sizes()), "; pass the layer's state tensors "
                       "(LinearState.tensors): a contiguous ", dtype_str(want), " [3]");
    check_same_device(fn, name, *t, "amax_history", history);
  }
}

namespace {

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> linear_forward_op(
    const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
    const Tensor& amax_history, const Tensor& amax, const Tensor& scale, const Tensor& scale_inv,
    const Tensor& counters, const Tensor& seeded, const std::string& scaling,
    const std::string& forward_dtype, const std::string& backward_dtype, int64_t margin,
    const std::string& amax_reduction, double amax_epsilon, bool power_2_scale,
    bool fast_accumulation, bool dgrad, bool wgrad, bool bgrad) {
  constexpr const char* fn = "fp8kit::linear_forward";
  check_state(fn, amax_history, amax, scale, scale_inv, counters, seeded);
  const LinearRecipe recipe = recipe_of(fn, scaling, forward_dtype, backward_dtype,
                                        amax_history.size(1), margin, amax_reduction,
                                        amax_epsilon, power_2_scale);
  DeviceScope scope(amax_history.device());
  LinearState st(recipe, amax_history, amax, scale, scale_inv, counters, seeded);
  const Tensor b = bias ? *bias : Tensor();
  const LinearCall call =
      linear_call(fn, st, input, weight, b, dgrad, wgrad, bgrad, fast_accumulation);
  const bool save = call.dgrad || call.wgrad || call.bgrad;
  LinearSaved saved;
  saved.own_buffers = true;
  Tensor y = linear_forward_below_autograd(st, input, weight, b, call, save ? &saved : nullptr);
  const auto fp8 = input.options().dtype(torch_fp8_type(recipe.forward_dtype));
  const auto f32 = input.options().dtype(at::kFloat);
  return {y, or_empty(saved.x_q, fp8), or_empty(saved.x_scale_inv, f32),
          or_empty(saved.w_q, fp8), or_empty(saved.w_scale_inv, f32)};
}

std::tuple<Tensor, Tensor, Tensor> linear_backward_op(
    const Tensor& grad_output, const Tensor& input_fp8, const Tensor& input_scale_inv,
    const Tensor& weight_fp8, const Tensor& weight_scale_inv, const Tensor& amax_history,
    const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, const Tensor& counters,
    const Tensor& seeded, const std::string& scaling, const std::string& forward_dtype,
    const std::string& backward_dtype, int64_t margin, const std::string& amax_reduction,
    double amax_epsilon, bool power_2_scale, at::IntArrayRef input_shape, bool forward_dgrad,
    bool forward_wgrad, bool dgrad, bool wgrad, bool bgrad,
    std::optional<at::ScalarType> weight_dtype) {
  constexpr const char* fn = "fp8kit::linear_backward";
  check_state(fn, amax_history, amax, scale, scale_inv, counters, seeded);
  const LinearRecipe recipe = recipe_of(fn, scaling, forward_dtype, backward_dtype,
                                        amax_history.size(1), margin, amax_reduction,
                                        amax_epsilon, power_2_scale);
  check_high_precision(fn, "grad_output", grad_output);
  check_same_device(fn, "grad_output", grad_output, "amax_history", amax_history);
  FP8KIT_VALUE_CHECK(!input_shape.empty() && grad_output.dim() == int64_t(input_shape.size()),
                     fn, ": grad_output has shape ", shape_str(grad_output.sizes()),
                     " but input_shape is ", shape_str(input_shape),
                     "; pass the forward input's shape");
  DeviceScope scope(amax_history.device());
  // y, and so dy, has the dtype of the input and the bias, and of the
  // weight unless weight_dtype names it (a float32 master weight).
  const LinearGrads g = linear_backward_saved(
      fn,
      c10::make_intrusive<LinearState>(recipe, amax_history, amax, scale, scale_inv, counters,
                                       seeded),
      grad_output, nullptr,
      SavedCopies{input_fp8, input_scale_inv, weight_fp8, weight_scale_inv}, input_shape,
      grad_output.size(-1), grad_output.scalar_type(), forward_dgrad, forward_wgrad, dgrad,
      wgrad, bgrad, at::Tensor(), weight_dtype);
  const auto opts = grad_output.options();
  return {or_empty(g.dx, opts), or_empty(g.dw, opts.dtype(weight_dtype.value_or(
                                                    grad_output.scalar_type()))),
          or_empty(g.db, opts)};
}

}  // namespace

void register_linear_kernels(torch::Library& m) {
  m.impl("linear_forward", &linear_forward_op);
  m.impl("linear_backward", &linear_backward_op);
}

}  // namespace fp8kit_torch
