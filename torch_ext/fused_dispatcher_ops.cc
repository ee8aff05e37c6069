// The kernels of the fused layers' steps as dispatcher ops (schemas in
// dispatcher_ops.cc): torch.ops.fp8kit.norm_forward, norm_backward,
// activation_forward, activation_backward, quantize_slot, the same
// kernels without a cast (norm_forward_values, activation_forward_values,
// activation_backward_values: BlockScaling's layers) and the Linear's
// steps on a cast input or gradient (linear_forward_cast_input,
// linear_backward_cast_grad; linear_backward is the Linear's), which is what
// torch.compile traces of fp8kit.torch.LayerNormLinear and LayerNormMLP
// (fp8kit/torch/_fused_steps.py). Each runs the function its pybind11
// binding of the same name runs (fused_ops.h), so both compute the same
// bits; what differs is how the arguments travel:
//   - the layer's scaling state is its LinearState's tensors, which the
//     casts update in place (the schemas say so), and its recipe the plain
//     values of LinearState.recipe, as for linear_forward;
//   - a cast's scale_inv is, as the binding's, a one-element view into its
//     scalars block (float32 [12]: scale, scale_inv, amax at 16-byte
//     aligned offsets, which cuBLASLt needs), at offset 4 (the fake
//     kernels say so too); the block's other floats are not all written,
//     so it is not returned whole;
//   - an output not asked for is an empty [0] tensor (FP8 copies in the
//     slot's format, the others in their own dtype).
#include <optional>
#include <string>
#include <tuple>

#include "descriptors.h"
#include "fused_ops.h"
#include "linear_dispatcher_ops.h"

namespace fp8kit_torch {
namespace {

using Tensor = at::Tensor;

// A LinearState over the state tensors, checked, for one op call.
struct StateArgs {
  const Tensor &history, &amax, &scale, &scale_inv, &counters, &seeded;
  const std::string &scaling, &forward_dtype, &backward_dtype;
  int64_t margin;
  const std::string& amax_reduction;
  double amax_epsilon;
  bool power_2_scale;

  LinearRecipe recipe(const char* fn) const {
    check_state(fn, history, amax, scale, scale_inv, counters, seeded);
    return recipe_of(fn, scaling, forward_dtype, backward_dtype, history.size(1), margin,
                     amax_reduction, amax_epsilon, power_2_scale);
  }
  LinearState make(const char* fn) const {
    return LinearState(recipe(fn), history, amax, scale, scale_inv, counters, seeded);
  }
  c10::intrusive_ptr<LinearState> make_ptr(const char* fn) const {
    return c10::make_intrusive<LinearState>(recipe(fn), history, amax, scale, scale_inv,
                                            counters, seeded);
  }
};

// A cast's three outputs: its FP8 copies (empty when not asked for) and
// its scale_inv.
std::tuple<Tensor, Tensor, Tensor> cast_outputs(const FusedCastOut& out, const LinearState& st,
                                                int slot) {
  const auto fp8 = at::TensorOptions().device(st.device).dtype(torch_fp8_type(st.slot_dtype(slot)));
  return {or_empty(out.data, fp8), or_empty(out.columnwise_data, fp8), out.scale_inv()};
}

// The kernels' parameters for FP8KIT_STATE_SCHEMA_ARGS, in its order, and
// the StateArgs over them.
#define FP8KIT_STATE_PARAMS                                                                     \
  const Tensor &amax_history, const Tensor &amax, const Tensor &scale, const Tensor &scale_inv, \
      const Tensor &counters, const Tensor &seeded, const std::string &scaling,                 \
      const std::string &forward_dtype, const std::string &backward_dtype, int64_t margin,      \
      const std::string &amax_reduction, double amax_epsilon, bool power_2_scale
#define FP8KIT_STATE_ARGS                                                                     \
  StateArgs {                                                                                 \
    amax_history, amax, scale, scale_inv, counters, seeded, scaling, forward_dtype,           \
        backward_dtype, margin, amax_reduction, amax_epsilon, power_2_scale                   \
  }

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> norm_forward_op(
    const Tensor& x, const Tensor& gamma, const std::optional<Tensor>& beta,
    const std::string& normalization, double epsilon, FP8KIT_STATE_PARAMS, int64_t slot,
    bool record, bool rowwise, bool columnwise) {
  constexpr const char* fn = "fp8kit::norm_forward";
  LinearState st = FP8KIT_STATE_ARGS.make(fn);
  const CastArgs cast = check_cast_args(fn, st, slot, record, rowwise, columnwise);
  const NormForwardOut out = norm_forward(fn, x, gamma, beta ? *beta : Tensor(), normalization,
                                          epsilon, cast, /*want_y=*/false);
  const auto [data, columnwise_data, data_scale_inv] = cast_outputs(out.cast, st, cast.slot);
  return {data, columnwise_data, data_scale_inv, or_empty(out.mean, out.rsigma.options()),
          out.rsigma};
}

std::tuple<Tensor, Tensor, Tensor> norm_backward_op(const Tensor& dy, const Tensor& x,
                                                     const std::optional<Tensor>& mean,
                                                     const Tensor& rsigma, const Tensor& gamma,
                                                     const std::string& normalization,
                                                     double epsilon) {
  auto [dx, dgamma, dbeta] = norm_backward("fp8kit::norm_backward", dy, x,
                                           mean ? *mean : Tensor(), rsigma, gamma, normalization,
                                           epsilon);
  return {dx, dgamma, or_empty(dbeta, dgamma.options())};
}

std::tuple<Tensor, Tensor, Tensor> norm_forward_values_op(const Tensor& x, const Tensor& gamma,
                                                          const std::optional<Tensor>& beta,
                                                          const std::string& normalization,
                                                          double epsilon) {
  auto [y, mean, rsigma] = norm_forward_values("fp8kit::norm_forward_values", x, gamma,
                                               beta ? *beta : Tensor(), normalization, epsilon);
  return {y, or_empty(mean, rsigma.options()), rsigma};
}

Tensor activation_forward_values_op(const Tensor& h, const std::string& activation) {
  return activation_forward_values("fp8kit::activation_forward_values", h, activation);
}

Tensor activation_backward_values_op(const Tensor& d_a, const Tensor& h,
                                     const std::string& activation) {
  return activation_backward_values("fp8kit::activation_backward_values", d_a, h, activation);
}

std::tuple<Tensor, Tensor, Tensor> activation_forward_op(const Tensor& h,
                                                         const std::string& activation,
                                                         FP8KIT_STATE_PARAMS, int64_t slot,
                                                         bool record, bool rowwise,
                                                         bool columnwise) {
  constexpr const char* fn = "fp8kit::activation_forward";
  LinearState st = FP8KIT_STATE_ARGS.make(fn);
  const CastArgs cast = check_cast_args(fn, st, slot, record, rowwise, columnwise);
  const ActivationForwardOut out = activation_forward(fn, h, activation, cast, /*want_a=*/false);
  return cast_outputs(out.cast, st, cast.slot);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> activation_backward_op(
    const Tensor& d_a, const Tensor& h, const std::string& activation, FP8KIT_STATE_PARAMS,
    int64_t slot, bool record, bool rowwise, bool columnwise,
    std::optional<at::ScalarType> sums_dtype, bool want_dh) {
  constexpr const char* fn = "fp8kit::activation_backward";
  LinearState st = FP8KIT_STATE_ARGS.make(fn);
  const CastArgs cast = check_cast_args(fn, st, slot, record, rowwise, columnwise);
  const ActivationBackwardOut out =
      activation_backward(fn, d_a, h, activation, cast, sums_dtype, want_dh);
  const auto [data, columnwise_data, data_scale_inv] = cast_outputs(out.cast, st, cast.slot);
  const auto opts = h.options();
  return {data, columnwise_data, data_scale_inv,
          or_empty(out.sums, opts.dtype(sums_dtype.value_or(at::kFloat))),
          or_empty(out.dh, opts)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_slot_op(
    const Tensor& x, FP8KIT_STATE_PARAMS, int64_t slot, bool record, bool rowwise,
    bool columnwise, std::optional<at::ScalarType> sums_dtype) {
  constexpr const char* fn = "fp8kit::quantize_slot";
  LinearState st = FP8KIT_STATE_ARGS.make(fn);
  const CastArgs cast = check_cast_args(fn, st, slot, record, rowwise, columnwise);
  const QuantizeSlotOut out = quantize_slot(fn, x, cast, sums_dtype);
  const auto [data, columnwise_data, data_scale_inv] = cast_outputs(out.cast, st, cast.slot);
  return {data, columnwise_data, data_scale_inv,
          or_empty(out.sums, x.options().dtype(sums_dtype.value_or(at::kFloat)))};
}

std::tuple<Tensor, Tensor, Tensor> linear_forward_cast_input_op(
    const Tensor& input_fp8, const Tensor& input_scale_inv, const Tensor& weight,
    const std::optional<Tensor>& bias, FP8KIT_STATE_PARAMS, bool fast_accumulation, bool record,
    bool dgrad, bool wgrad, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* fn = "fp8kit::linear_forward_cast_input";
  LinearState st = FP8KIT_STATE_ARGS.make(fn);
  const CastInput x{input_fp8, Tensor(), input_scale_inv, Tensor()};
  const CastInputForwardOut out =
      linear_forward_cast_input(fn, st, x, weight, bias ? *bias : Tensor(), nullptr,
                                fast_accumulation, record, dgrad, wgrad, Tensor(),
                                /*own_buffers=*/true, out_dtype);
  const auto opts = weight.options();
  return {out.y, or_empty(out.w_q, opts.dtype(torch_fp8_type(st.recipe.forward_dtype))),
          or_empty(out.w_scale_inv, opts.dtype(at::kFloat))};
}

std::tuple<Tensor, Tensor> linear_backward_cast_grad_op(
    const Tensor& grad_output_fp8, const Tensor& grad_output_columnwise,
    const Tensor& grad_output_scale_inv, const Tensor& input_fp8, const Tensor& input_scale_inv,
    const Tensor& weight_fp8, const Tensor& weight_scale_inv, FP8KIT_STATE_PARAMS,
    at::IntArrayRef input_shape, int64_t out_features, at::ScalarType dtype, bool forward_dgrad,
    bool forward_wgrad, bool dgrad, bool wgrad, std::optional<at::ScalarType> weight_dtype) {
  constexpr const char* fn = "fp8kit::linear_backward_cast_grad";
  const CastInput dy{grad_output_fp8, grad_output_columnwise, grad_output_scale_inv, Tensor()};
  const LinearGrads g = linear_backward_saved(
      fn, FP8KIT_STATE_ARGS.make_ptr(fn), Tensor(), &dy,
      SavedCopies{input_fp8, input_scale_inv, weight_fp8, weight_scale_inv}, input_shape,
      out_features, dtype, forward_dgrad, forward_wgrad, dgrad, wgrad, /*bgrad=*/false,
      Tensor(), weight_dtype);
  const auto opts = amax_history.options().dtype(dtype);
  return {or_empty(g.dx, opts), or_empty(g.dw, opts.dtype(weight_dtype.value_or(dtype)))};
}

#undef FP8KIT_STATE_PARAMS
#undef FP8KIT_STATE_ARGS

}  // namespace

void register_fused_kernels(torch::Library& m) {
  m.impl("norm_forward", &norm_forward_op);
  m.impl("norm_backward", &norm_backward_op);
  m.impl("norm_forward_values", &norm_forward_values_op);
  m.impl("activation_forward_values", &activation_forward_values_op);
  m.impl("activation_backward_values", &activation_backward_values_op);
  m.impl("activation_forward", &activation_forward_op);
  m.impl("activation_backward", &activation_backward_op);
  m.impl("quantize_slot", &quantize_slot_op);
  m.impl("linear_forward_cast_input", &linear_forward_cast_input_op);
  m.impl("linear_backward_cast_grad", &linear_backward_cast_grad_op);
}

}  // namespace fp8kit_torch
