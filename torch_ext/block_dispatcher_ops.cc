// torch.ops.fp8kit.quantize_block, dequantize_block and gemm_block: the
// block-scaled ops of block_ops.h registered with PyTorch's dispatcher (a
// fragment of the fp8kit library of dispatcher_ops.cc), so that
// torch.compile traces them and fp8kit.torch's block-scaled layers with
// them. Each kernel calls the same function as the pybind11 binding of the
// same name; where a schema must differ, it does as dispatcher_ops.cc's ops:
// FP8 dtypes are torch dtypes, and a copy not asked for comes back as an
// empty [0] tensor (FP8 data, float32 scales) on x's device. gemm_block has
// no accumulate or out (each would make it a mutating op).
// The fake (meta) kernels are in fp8kit/torch/_block_fake_ops.py.
#include <torch/library.h>

#include "block_ops.h"
#include "descriptors.h"
#include "errors.h"

namespace fp8kit_torch {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_block_op(
    const at::Tensor& x, at::ScalarType fp8_dtype, const std::string& scaling_mode, bool rowwise,
    bool columnwise, double amax_epsilon, bool power_2_scale) {
  constexpr const char* fn = "fp8kit::quantize_block";
  const std::optional<fp8kit_dtype> f = fp8_dtype_of(fp8_dtype);
  FP8KIT_TYPE_CHECK(f.has_value(), fn, ": fp8_dtype is ", dtype_str(fp8_dtype),
                    "; use torch.float8_e4m3fn or torch.float8_e5m2");
  auto [data, sinv, cw, cw_sinv] =
      quantize_block(fn, x, *f, parse_block_mode(scaling_mode, fn, "scaling_mode"), rowwise,
                     columnwise, amax_epsilon, power_2_scale);
  const at::TensorOptions fp8 = x.options().dtype(fp8_dtype), f32 = x.options().dtype(at::kFloat);
  return {or_empty(data, fp8), or_empty(sinv, f32), or_empty(cw, fp8), or_empty(cw_sinv, f32)};
}

at::Tensor dequantize_block_op(const at::Tensor& data, const at::Tensor& block_scale_inv,
                               const std::string& scaling_mode, at::ScalarType out_dtype,
                               bool from_columnwise, at::OptionalIntArrayRef shape) {
  constexpr const char* fn = "fp8kit::dequantize_block";
  std::optional<std::vector<int64_t>> logical;
  if (shape) logical = shape->vec();
  return dequantize_block(fn, data, block_scale_inv,
                          parse_block_mode(scaling_mode, fn, "scaling_mode"), out_dtype,
                          from_columnwise, logical);
}

at::Tensor gemm_block_op(const OptTensor& a, const OptTensor& a_block_scale_inv,
                         const OptTensor& a_columnwise,
                         const OptTensor& a_columnwise_block_scale_inv,
                         const std::string& a_scaling_mode, const OptTensor& b,
                         const OptTensor& b_block_scale_inv, const OptTensor& b_columnwise,
                         const OptTensor& b_columnwise_block_scale_inv,
                         const std::string& b_scaling_mode, bool trans_a, bool trans_b,
                         at::ScalarType out_dtype, const OptTensor& bias) {
  constexpr const char* fn = "fp8kit::gemm_block";
  const BlockOperand oa{a, a_block_scale_inv, a_columnwise, a_columnwise_block_scale_inv,
                        parse_block_mode(a_scaling_mode, fn, "a_scaling_mode")};
  const BlockOperand ob{b, b_block_scale_inv, b_columnwise, b_columnwise_block_scale_inv,
                        parse_block_mode(b_scaling_mode, fn, "b_scaling_mode")};
  return gemm_block(fn, oa, ob, trans_a, trans_b, out_dtype, bias, /*accumulate=*/false,
                    /*out=*/std::nullopt);
}

// One kernel per op serves CPU and CUDA: the ops pick the device from their
// inputs.
void register_block_kernels(torch::Library& m) {
  m.impl("quantize_block", &quantize_block_op);
  m.impl("dequantize_block", &dequantize_block_op);
  m.impl("gemm_block", &gemm_block_op);
}

}  // namespace
}  // namespace fp8kit_torch

TORCH_LIBRARY_FRAGMENT(fp8kit, m) {
  m.def(
      "quantize_block(Tensor x, ScalarType fp8_dtype, str scaling_mode, bool rowwise, bool "
      "columnwise, float amax_epsilon=0., bool power_2_scale=True) -> (Tensor data, Tensor "
      "block_scale_inv, Tensor columnwise_data, Tensor columnwise_block_scale_inv)");
  m.def(
      "dequantize_block(Tensor data, Tensor block_scale_inv, str scaling_mode, ScalarType "
      "out_dtype, bool from_columnwise=False, int[]? shape=None) -> Tensor");
  m.def(
      "gemm_block(Tensor? a, Tensor? a_block_scale_inv, Tensor? a_columnwise, Tensor? "
      "a_columnwise_block_scale_inv, str a_scaling_mode, Tensor? b, Tensor? b_block_scale_inv, "
      "Tensor? b_columnwise, Tensor? b_columnwise_block_scale_inv, str b_scaling_mode, bool "
      "trans_a, bool trans_b, ScalarType out_dtype, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(fp8kit, CPU, m) { fp8kit_torch::register_block_kernels(m); }

#ifdef FP8KIT_TORCH_CUDA
TORCH_LIBRARY_IMPL(fp8kit, CUDA, m) { fp8kit_torch::register_block_kernels(m); }
#endif
