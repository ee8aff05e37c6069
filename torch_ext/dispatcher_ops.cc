// torch.ops.fp8kit.*: the functional ops of ops.h registered with PyTorch's
// dispatcher, so that torch.compile traces them instead of breaking the
// graph. Each kernel calls the same function as the pybind11 binding of the
// same name; what differs is what a schema can say:
//   - FP8 dtypes are torch dtypes (torch.float8_e4m3fn / torch.float8_e5m2);
//     delayed_scaling_update keeps the bindings' names ("e4m3" / "e5m2");
//   - a layout not asked for comes back as an empty tensor of shape [0] in
//     the FP8 dtype on x's device (a schema cannot return None for Tensor);
//   - outputs the bindings write into a caller's tensor (quantize's
//     amax_out) are returned instead, and gemm has no out / accumulate /
//     gelu_aux / d_amax (each would make it a mutating op);
//   - delayed_scaling_update mutates its state, and its schema says so.
// linear_forward and linear_backward, the FP8 Linear's two steps, have their
// kernels in linear_dispatcher_ops.cc, and the fused layers' steps
// (norm_forward, norm_backward, activation_forward, activation_backward,
// quantize_slot, and the *_values ops that cast nothing) theirs in
// fused_dispatcher_ops.cc (each file says what its ops take).
// The fake (meta) kernels are in fp8kit/torch/_fake_ops.py, the module named
// by set_python_module below.
#include <torch/library.h>

#include "descriptors.h"
#include "errors.h"
#include "linear_dispatcher_ops.h"
#include "ops.h"

namespace fp8kit_torch {
namespace {

fp8kit_dtype fp8_arg(const char* fn, const char* arg, at::ScalarType t) {
  const std::optional<fp8kit_dtype> f = fp8_dtype_of(t);
  FP8KIT_TYPE_CHECK(f.has_value(), fn, ": ", arg, " is ", dtype_str(t),
                    "; use torch.float8_e4m3fn or torch.float8_e5m2");
  return *f;
}

at::Tensor amax_op(const at::Tensor& x) { return amax("fp8kit::amax", x); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_op(
    const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8_dtype, bool rowwise,
    bool columnwise) {
  constexpr const char* fn = "fp8kit::quantize";
  const fp8kit_dtype f = fp8_arg(fn, "fp8_dtype", fp8_dtype);
  at::Tensor amax_out = at::empty({1}, x.options().dtype(at::kFloat));
  auto [data, columnwise_data, scale_inv] =
      quantize(fn, x, scale, f, rowwise, columnwise, amax_out);
  const at::TensorOptions fp8 = x.options().dtype(fp8_dtype);
  return {or_empty(data, fp8), or_empty(columnwise_data, fp8), scale_inv, amax_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_current_scaling_op(
    const at::Tensor& x, at::ScalarType fp8_dtype, bool rowwise, bool columnwise,
    double amax_epsilon, bool power_2_scale) {
  constexpr const char* fn = "fp8kit::quantize_current_scaling";
  const fp8kit_dtype f = fp8_arg(fn, "fp8_dtype", fp8_dtype);
  auto [data, columnwise_data, scale, scale_inv, amax_t] =
      quantize_current_scaling(fn, x, f, rowwise, columnwise, amax_epsilon, power_2_scale);
  const at::TensorOptions fp8 = x.options().dtype(fp8_dtype);
  return {or_empty(data, fp8), or_empty(columnwise_data, fp8), scale, scale_inv, amax_t};
}

at::Tensor dequantize_op(const at::Tensor& data, const at::Tensor& scale_inv,
                         at::ScalarType out_dtype, bool from_columnwise,
                         at::OptionalIntArrayRef shape) {
  std::optional<std::vector<int64_t>> logical;
  if (shape) logical = shape->vec();
  return dequantize("fp8kit::dequantize", data, scale_inv, out_dtype, from_columnwise, logical);
}

at::Tensor columnwise_from_rowwise_op(const at::Tensor& data) {
  return columnwise_from_rowwise("fp8kit::columnwise_from_rowwise", data);
}

void delayed_scaling_update_op(at::TensorList amax_histories, at::TensorList amaxes,
                               at::TensorList scales, at::TensorList scale_invs,
                               std::vector<std::string> fp8_dtypes, int64_t margin,
                               std::string amax_reduction) {
  delayed_scaling_update("fp8kit::delayed_scaling_update", amax_histories.vec(), amaxes.vec(),
                         scales.vec(), scale_invs.vec(), fp8_dtypes, margin, amax_reduction);
}

at::Tensor gemm_op(const OptTensor& a, const at::Tensor& a_scale_inv,
                   const OptTensor& a_columnwise, const OptTensor& b,
                   const at::Tensor& b_scale_inv, const OptTensor& b_columnwise, bool trans_a,
                   bool trans_b, at::ScalarType out_dtype, const OptTensor& bias, bool gelu,
                   bool use_split_accumulator, const OptTensor& d_scale) {
  constexpr const char* fn = "fp8kit::gemm";
  // fp8kit.torch.gemm's rule, here because the dispatcher skips that wrapper.
  FP8KIT_VALUE_CHECK(!b || b->dim() == 2, fn, ": b has shape ", shape_str(b->sizes()),
                     "; b is one 2-D matrix (its columnwise copy too)");
  FP8KIT_VALUE_CHECK(!b_columnwise || b_columnwise->dim() == 2, fn, ": b_columnwise has shape ",
                     shape_str(b_columnwise->sizes()),
                     "; b is one 2-D matrix (its columnwise copy too)");
  return gemm(fn, a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, trans_a, trans_b,
              out_dtype, bias, gelu, /*gelu_aux=*/std::nullopt, /*accumulate=*/false,
              use_split_accumulator, d_scale, /*d_amax=*/std::nullopt, /*out=*/std::nullopt);
}

// One kernel per op serves CPU and CUDA: the ops pick the device from their
// inputs.
void register_kernels(torch::Library& m) {
  m.impl("amax", &amax_op);
  m.impl("quantize", &quantize_op);
  m.impl("quantize_current_scaling", &quantize_current_scaling_op);
  m.impl("dequantize", &dequantize_op);
  m.impl("columnwise_from_rowwise", &columnwise_from_rowwise_op);
  m.impl("delayed_scaling_update", &delayed_scaling_update_op);
  m.impl("gemm", &gemm_op);
  register_linear_kernels(m);
  register_fused_kernels(m);
}

}  // namespace
}  // namespace fp8kit_torch

TORCH_LIBRARY(fp8kit, m) {
  m.set_python_module("fp8kit.torch._fake_ops");
  m.def("amax(Tensor x) -> Tensor");
  m.def(
      "quantize(Tensor x, Tensor scale, ScalarType fp8_dtype, bool rowwise, bool columnwise) -> "
      "(Tensor data, Tensor columnwise_data, Tensor scale_inv, Tensor amax)");
  m.def(
      "quantize_current_scaling(Tensor x, ScalarType fp8_dtype, bool rowwise, bool columnwise, "
      "float amax_epsilon=0., bool power_2_scale=False) -> (Tensor data, Tensor "
      "columnwise_data, Tensor scale, Tensor scale_inv, Tensor amax)");
  m.def(
      "dequantize(Tensor data, Tensor scale_inv, ScalarType out_dtype, bool "
      "from_columnwise=False, int[]? shape=None) -> Tensor");
  m.def("columnwise_from_rowwise(Tensor data) -> Tensor");
  m.def(
      "delayed_scaling_update(Tensor(a!)[] amax_histories, Tensor[] amaxes, Tensor(b!)[] "
      "scales, Tensor(c!)[] scale_invs, str[] fp8_dtypes, int margin=0, str "
      "amax_reduction=\"max\") -> ()");
  m.def(
      "gemm(Tensor? a, Tensor a_scale_inv, Tensor? a_columnwise, Tensor? b, Tensor b_scale_inv, "
      "Tensor? b_columnwise, bool trans_a, bool trans_b, ScalarType out_dtype, Tensor? "
      "bias=None, bool gelu=False, bool use_split_accumulator=True, Tensor? d_scale=None) -> "
      "Tensor");
  // The recipe's arguments are LinearState.recipe's plain values (the
  // delayed ones are ignored under current scaling and the other way round).
  m.def(
      "linear_forward(Tensor input, Tensor weight, Tensor? bias, Tensor(a!) amax_history, "
      "Tensor(b!) amax, Tensor(c!) scale, Tensor(d!) scale_inv, Tensor(e!) counters, Tensor(f!) "
      "seeded, str scaling, str forward_dtype, str backward_dtype, int margin, str "
      "amax_reduction, float amax_epsilon, bool power_2_scale, bool fast_accumulation, bool "
      "dgrad, bool wgrad, bool bgrad) -> (Tensor out, Tensor input_fp8, Tensor "
      "input_scale_inv, Tensor weight_fp8, Tensor weight_scale_inv)");
  m.def(
      "linear_backward(Tensor grad_output, Tensor input_fp8, Tensor input_scale_inv, Tensor "
      "weight_fp8, Tensor weight_scale_inv, Tensor(a!) amax_history, Tensor(b!) amax, Tensor(c!) "
      "scale, Tensor(d!) scale_inv, Tensor(e!) counters, Tensor(f!) seeded, str scaling, str "
      "forward_dtype, str backward_dtype, int margin, str amax_reduction, float amax_epsilon, bool "
      "power_2_scale, SymInt[] input_shape, bool forward_dgrad, bool forward_wgrad, bool dgrad, "
      "bool wgrad, bool bgrad, ScalarType? weight_dtype=None) -> (Tensor grad_input, Tensor "
      "grad_weight, Tensor grad_bias)");
  m.def("norm_forward(Tensor x, Tensor gamma, Tensor? beta, str normalization, float epsilon, "
        FP8KIT_STATE_SCHEMA_ARGS
        ", int slot, bool record, bool rowwise, bool columnwise) -> (Tensor data, Tensor "
        "columnwise_data, Tensor scale_inv, Tensor mean, Tensor rsigma)");
  m.def(
      "norm_backward(Tensor dy, Tensor x, Tensor? mean, Tensor rsigma, Tensor gamma, str "
      "normalization, float epsilon) -> (Tensor dx, Tensor dgamma, Tensor dbeta)");
  // Without a cast (BlockScaling's layers): mean is empty for RMSNorm.
  m.def("norm_forward_values(Tensor x, Tensor gamma, Tensor? beta, str normalization, float "
        "epsilon) -> (Tensor y, Tensor mean, Tensor rsigma)");
  m.def("activation_forward_values(Tensor h, str activation) -> Tensor");
  m.def("activation_backward_values(Tensor d_a, Tensor h, str activation) -> Tensor");
  m.def("activation_forward(Tensor h, str activation, " FP8KIT_STATE_SCHEMA_ARGS
        ", int slot, bool record, bool rowwise, bool columnwise) -> (Tensor data, Tensor "
        "columnwise_data, Tensor scale_inv)");
  m.def("activation_backward(Tensor d_a, Tensor h, str activation, " FP8KIT_STATE_SCHEMA_ARGS
        ", int slot, bool record, bool rowwise, bool columnwise, ScalarType? sums_dtype, bool "
        "want_dh) -> (Tensor data, Tensor columnwise_data, Tensor scale_inv, Tensor sums, Tensor "
        "dh)");
  m.def("quantize_slot(Tensor x, " FP8KIT_STATE_SCHEMA_ARGS
        ", int slot, bool record, bool rowwise, bool columnwise, ScalarType? sums_dtype) -> "
        "(Tensor data, Tensor columnwise_data, Tensor scale_inv, Tensor sums)");
  m.def("linear_forward_cast_input(Tensor input_fp8, Tensor input_scale_inv, Tensor weight, "
        "Tensor? bias, " FP8KIT_STATE_SCHEMA_ARGS
        ", bool fast_accumulation, bool record, bool dgrad, bool wgrad, ScalarType? out_dtype="
        "None) -> (Tensor out, Tensor weight_fp8, Tensor weight_scale_inv)");
  // Reads the state (its recipe and device), writes none of it.
  m.def("linear_backward_cast_grad(Tensor grad_output_fp8, Tensor grad_output_columnwise, Tensor "
        "grad_output_scale_inv, Tensor input_fp8, Tensor input_scale_inv, Tensor weight_fp8, "
        "Tensor weight_scale_inv, Tensor amax_history, Tensor amax, Tensor scale, Tensor "
        "scale_inv, Tensor counters, Tensor seeded, str scaling, str forward_dtype, str "
        "backward_dtype, int margin, str amax_reduction, float amax_epsilon, bool power_2_scale, "
        "SymInt[] input_shape, int out_features, ScalarType dtype, bool forward_dgrad, bool "
        "forward_wgrad, bool dgrad, bool wgrad, ScalarType? weight_dtype=None) -> (Tensor "
        "grad_input, Tensor grad_weight)");
}

TORCH_LIBRARY_IMPL(fp8kit, CPU, m) { fp8kit_torch::register_kernels(m); }

#ifdef FP8KIT_TORCH_CUDA
TORCH_LIBRARY_IMPL(fp8kit, CUDA, m) { fp8kit_torch::register_kernels(m); }
#endif
