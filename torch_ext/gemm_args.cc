#include "gemm_args.h"

#include "descriptors.h"
#include "errors.h"

namespace fp8kit_torch {

OperandShape gemm_operand_shape(const char* fn, const char* name,
                                const std::optional<at::Tensor>& x, const char* name_cw,
                                const std::optional<at::Tensor>& x_cw) {
  OperandShape s{0, 0};
  if (x) {
    FP8KIT_VALUE_CHECK(x->dim() >= 1, fn, ": ", name, " is 0-d; GEMM operands need rank >= 1");
    const auto cw = columnwise_shape(x->sizes());
    s = {cw[1], cw[0]};
  }
  if (x_cw) {
    FP8KIT_VALUE_CHECK(x_cw->dim() == 2, fn, ": ", name_cw, " has shape ",
                       shape_str(x_cw->sizes()),
                       "; columnwise data is 2-D [last dim, prod(leading dims)]");
    if (!x) s = {x_cw->size(1), x_cw->size(0)};
  }
  return s;
}

GemmShape gemm_shape(const char* fn, const fp8kit_tensor& a, const at::Device& device_a,
                     const fp8kit_tensor& b, const at::Device& device_b, bool trans_a,
                     bool trans_b) {
  FP8KIT_VALUE_CHECK(device_a == device_b, fn, ": a is on ", device_str(device_a),
                     " but b is on ", device_str(device_b), "; move both operands to one device");
  const int64_t m = trans_a ? a.shape[1] : a.shape[0];
  const int64_t k = trans_a ? a.shape[0] : a.shape[1];
  const int64_t kb = trans_b ? b.shape[1] : b.shape[0];
  const int64_t n = trans_b ? b.shape[0] : b.shape[1];
  FP8KIT_VALUE_CHECK(k == kb, fn, ": op(a) is ", m, "x", k, " (trans_a=", trans_a,
                     ") but op(b) is ", kb, "x", n, " (trans_b=", trans_b,
                     "); the inner dimensions must match: check the shapes and trans flags");
  return {m, n};
}

at::Tensor gemm_output(const char* fn, const std::optional<at::Tensor>& out,
                       at::ScalarType out_dtype, GemmShape shape, bool accumulate,
                       const char* ref_arg, const at::Tensor& ref) {
  const int64_t m = shape.m, n = shape.n;
  if (!out) {
    FP8KIT_VALUE_CHECK(!accumulate, fn,
                       ": accumulate=True adds into out's old contents, so pass out=");
    return at::empty({m, n}, at::TensorOptions().dtype(out_dtype).device(ref.device()));
  }
  check_dense(fn, "out", *out);
  FP8KIT_TYPE_CHECK(out->scalar_type() == out_dtype, fn, ": out has dtype ",
                    dtype_str(out->scalar_type()), " but out_dtype is ", dtype_str(out_dtype));
  FP8KIT_VALUE_CHECK(out->dim() == 2 && out->size(0) == m && out->size(1) == n, fn,
                     ": out has shape ", shape_str(out->sizes()), " but the product is [", m,
                     ", ", n, "]");
  check_contiguous(fn, "out", *out);
  check_same_device(fn, "out", *out, ref_arg, ref);
  return *out;
}

fp8kit_gemm_config gemm_config(bool trans_a, bool trans_b, bool accumulate,
                               bool use_split_accumulator) {
  fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
  cfg.trans_a = trans_a ? 1 : 0;
  cfg.trans_b = trans_b ? 1 : 0;
  cfg.beta = accumulate ? 1.0f : 0.0f;
  cfg.use_split_accumulator = use_split_accumulator ? 1 : 0;
  return cfg;
}

at::Tensor set_gemm_bias(const char* fn, const at::Tensor& bias,
                         std::optional<fp8kit_dtype> dtype, const char* dtype_fix, int64_t n,
                         const char* ref_arg, const at::Tensor& ref, fp8kit_gemm_config* cfg) {
  check_dense(fn, "bias", bias);
  FP8KIT_TYPE_CHECK(dtype.has_value(), fn, ": bias has dtype ", dtype_str(bias.scalar_type()),
                    "; ", dtype_fix);
  FP8KIT_VALUE_CHECK(bias.dim() == 1 && bias.numel() == n, fn, ": bias has shape ",
                     shape_str(bias.sizes()), " but the output has N = ", n,
                     " columns; bias must be [N]");
  check_same_device(fn, "bias", bias, ref_arg, ref);
  at::Tensor contiguous = bias.contiguous();
  cfg->bias = contiguous.data_ptr();
  cfg->bias_dtype = *dtype;
  cfg->bias_numel = n;
  return contiguous;
}

}  // namespace fp8kit_torch
