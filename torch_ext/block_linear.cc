// fp8kit.torch.Linear's steps under BlockScaling, for the Linear and the
// fused layers' GEMMs alike (fp8kit/torch/_block_linear.py wraps them in
// one autograd.Function): the protocol of fp8kit/linear.h's block-scaling
// section, in C++ as the per-tensor Linear's is.
//
//   forward   x [M, K] and w [N, K] cast once each (x 1x128, w 128x128),
//             in the copies the core's plan names for a TN device (the
//             block-scaled GEMMs are TN only): the rowwise ones for
//             y = x @ w^T, the columnwise ones the gradients read, which
//             are what the forward keeps (never a high-precision x)
//   backward  dy cast once (1x128, both copies in one pass), dgrad and
//             wgrad from the kept copies; the bias gradient dy's float32
//             column sums in the bias's dtype
//
// Every GEMM runs on the token count rounded up to FP8KIT_GEMM_DIM_MULTIPLE
// (and at least min_rows, which torch.compile's traces ask for): x and dy
// get zero rows appended, which leave every real tile's scale and the
// result unchanged, and y and dx drop them again. The GEMMs write bfloat16
// or float32; a float16 layer computes in float32 and rounds once. The bias
// goes into the forward GEMM's epilogue for bfloat16 and is added after it
// otherwise.
//
// Both steps are dispatcher ops (torch.ops.fp8kit.block_linear_forward,
// block_linear_backward; fakes in fp8kit/torch/_block_fake_ops.py), called
// the same way eagerly and under torch.compile. `statistics` (eager only:
// fp8kit.torch.inspect refuses tracing) gets the rows that
// linear_autograd.h lays out, scale_inv NaN: a block cast has no one scale.
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "block_ops.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "linear_autograd.h"

namespace fp8kit_torch {
namespace {

using Tensor = at::Tensor;
constexpr fp8kit_scaling_mode kTile = FP8KIT_SCALING_BLOCK_1X128;
constexpr fp8kit_scaling_mode kBlock = FP8KIT_SCALING_BLOCK_128X128;

// The token count every GEMM of a call with m tokens runs on.
int64_t gemm_rows(int64_t m, int64_t min_rows) {
  const int64_t mult = FP8KIT_GEMM_DIM_MULTIPLE;
  return std::max((m + mult - 1) / mult * mult, min_rows);
}

// The core's plan for `rows` tokens on a TN device: which copies each cast
// writes and which the forward keeps.
fp8kit_linear_plan block_plan(int64_t rows, int64_t k, int64_t n, bool dgrad, bool wgrad) {
  fp8kit_linear_plan plan;
  check_status(fp8kit_linear_plan_make(rows, k, n, FP8KIT_WEIGHT_OUT_IN, dgrad ? 1 : 0,
                                       wgrad ? 1 : 0, /*non_tn=*/0, &plan));
  return plan;
}

// Contiguous t [m, cols] with zero rows appended up to `rows`.
Tensor padded(const Tensor& t, int64_t rows) {
  const Tensor c = t.contiguous();
  if (c.size(0) == rows) return c;
  Tensor p = at::zeros({rows, c.size(1)}, c.options());
  p.narrow(0, 0, c.size(0)).copy_(c);
  return p;
}

at::ScalarType gemm_dtype(at::ScalarType layer) {
  return layer == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

// The first m rows of a GEMM's output, in the layer's dtype.
Tensor layer_rows(const Tensor& d, int64_t m, at::ScalarType dtype) {
  const Tensor rows = d.size(0) == m ? d : d.narrow(0, 0, m);
  return rows.scalar_type() == dtype ? rows : rows.to(dtype);
}

BlockBuffers cast(const Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode, fp8kit_copies c,
                  double amax_epsilon, bool power_2_scale) {
  BlockBuffers b = alloc_block_buffers(x, fp8, mode, c.rowwise != 0, c.columnwise != 0);
  quantize_block_into(x, fp8, mode, b, amax_epsilon, power_2_scale);
  return b;
}

// Row `slot` of `statistics`: the cast of x into b's rowwise copy (its
// columnwise one when there is no rowwise copy).
void record(const Tensor& statistics, int slot, const Tensor& x, fp8kit_dtype fp8,
            fp8kit_scaling_mode mode, const BlockBuffers& b) {
  if (!statistics.defined()) return;
  const bool rowwise = b.data.defined();
  record_statistics(statistics, slot, x, fp8, rowwise ? b.data : b.columnwise_data, !rowwise,
                    rowwise ? b.block_scale_inv : b.columnwise_block_scale_inv, mode);
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

fp8kit_dtype fp8_of(const char* fn, const char* arg, at::ScalarType t) {
  const std::optional<fp8kit_dtype> f = fp8_dtype_of(t);
  FP8KIT_TYPE_CHECK(f.has_value(), fn, ": ", arg, " is ", dtype_str(t),
                    "; use torch.float8_e4m3fn or torch.float8_e5m2");
  return *f;
}

void check_statistics_arg(const char* fn, const std::optional<Tensor>& statistics,
                          const Tensor& x) {
  if (statistics) check_statistics(fn, *statistics, x.device());
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> block_linear_forward_op(
    const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
    at::ScalarType forward_dtype, double amax_epsilon, bool power_2_scale, bool dgrad,
    bool wgrad, int64_t min_rows, const std::optional<Tensor>& statistics) {
  constexpr const char* fn = "fp8kit::block_linear_forward";
  const fp8kit_dtype fwd = fp8_of(fn, "forward_dtype", forward_dtype);
  check_high_precision(fn, "x", x);
  check_high_precision(fn, "weight", weight);
  FP8KIT_VALUE_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), fn,
                     ": x has shape ", shape_str(x.sizes()), " and weight ",
                     shape_str(weight.sizes()), "; they must be [M, K] and [N, K]");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), fn, ": x and weight have dtypes ",
              dtype_str(x.scalar_type()), " and ", dtype_str(weight.scalar_type()),
              "; they must match");
  check_same_device(fn, "weight", weight, "x", x);
  check_amax_epsilon(fn, amax_epsilon);
  check_statistics_arg(fn, statistics, x);
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  const int64_t rows = gemm_rows(m, min_rows);
  const fp8kit_linear_plan plan = block_plan(rows, k, n, dgrad, wgrad);
  DeviceScope scope(x.device());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const Tensor xp = padded(x, rows);
  const Tensor w = weight.contiguous();
  const BlockBuffers xq = cast(xp, fwd, kTile, plan.quantize[kInput], amax_epsilon,
                               power_2_scale);
  const BlockBuffers wq = cast(w, fwd, kBlock, plan.quantize[kWeight], amax_epsilon,
                               power_2_scale);
  const Tensor stats = statistics ? *statistics : Tensor();
  record(stats, kInput, xp, fwd, kTile, xq);
  record(stats, kWeight, w, fwd, kBlock, wq);
  const at::ScalarType d_dtype = gemm_dtype(x.scalar_type());
  const bool fused_bias = bias && d_dtype == at::kBFloat16;
  Tensor y = gemm_block(fn, BlockOperand{xq.data, xq.block_scale_inv, {}, {}, kTile},
                        BlockOperand{wq.data, wq.block_scale_inv, {}, {}, kBlock},
                        /*trans_a=*/false, /*trans_b=*/true, d_dtype,
                        fused_bias ? bias : std::nullopt, /*accumulate=*/false, std::nullopt);
  if (bias && !fused_bias) y.add_(*bias);
  const auto fp8 = x.options().dtype(torch_fp8_type(fwd));
  const auto f32 = x.options().dtype(at::kFloat);
  const bool keep_x = plan.saved_input.columnwise != 0, keep_w = plan.saved_weight.columnwise != 0;
  return {layer_rows(y, m, x.scalar_type()),
          or_empty(keep_x ? xq.columnwise_data : Tensor(), fp8),
          or_empty(keep_x ? xq.columnwise_block_scale_inv : Tensor(), f32),
          or_empty(keep_w ? wq.columnwise_data : Tensor(), fp8),
          or_empty(keep_w ? wq.columnwise_block_scale_inv : Tensor(), f32)};
}

std::tuple<Tensor, Tensor, Tensor> block_linear_backward_op(
    const Tensor& grad_output, const Tensor& x_columnwise, const Tensor& x_columnwise_scale_inv,
    const Tensor& w_columnwise, const Tensor& w_columnwise_scale_inv,
    at::ScalarType backward_dtype, double amax_epsilon, bool power_2_scale, int64_t in_features,
    bool dgrad, bool wgrad, bool bgrad, int64_t min_rows,
    const std::optional<Tensor>& statistics) {
  constexpr const char* fn = "fp8kit::block_linear_backward";
  const fp8kit_dtype bwd = fp8_of(fn, "backward_dtype", backward_dtype);
  const Tensor& dy = grad_output;
  check_high_precision(fn, "grad_output", dy);
  FP8KIT_VALUE_CHECK(dy.dim() == 2 && in_features > 0, fn, ": grad_output has shape ",
                     shape_str(dy.sizes()), " and in_features is ", in_features,
                     "; pass the [M, N] gradient of a forward over [M, in_features]");
  check_amax_epsilon(fn, amax_epsilon);
  check_statistics_arg(fn, statistics, dy);
  const int64_t m = dy.size(0), n = dy.size(1), k = in_features;
  const int64_t rows = gemm_rows(m, min_rows);
  const fp8kit_linear_plan plan = block_plan(rows, k, n, dgrad, wgrad);
  DeviceScope scope(dy.device());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto opts = dy.options();
  Tensor dx, dw, db;
  if (dgrad || wgrad) {
    const Tensor dyp = padded(dy, rows);
    const BlockBuffers dq = cast(dyp, bwd, kTile, plan.quantize[kGrad], amax_epsilon,
                                 power_2_scale);
    record(statistics ? *statistics : Tensor(), kGrad, dyp, bwd, kTile, dq);
    const at::ScalarType d_dtype = gemm_dtype(dy.scalar_type());
    if (dgrad) {  // dx[M, K] = dy[M, N] @ w[N, K], w read from its columnwise copy
      dx = layer_rows(gemm_block(fn, BlockOperand{dq.data, dq.block_scale_inv, {}, {}, kTile},
                                 BlockOperand{{}, {}, opt(w_columnwise),
                                              opt(w_columnwise_scale_inv), kBlock},
                                 false, false, d_dtype, std::nullopt, false, std::nullopt),
                      m, dy.scalar_type());
    }
    if (wgrad) {  // dw[N, K] = dy^T @ x over the (padded) tokens
      dw = layer_rows(
          gemm_block(fn, BlockOperand{{}, {}, dq.columnwise_data, dq.columnwise_block_scale_inv,
                                      kTile},
                     BlockOperand{{}, {}, opt(x_columnwise), opt(x_columnwise_scale_inv), kTile},
                     true, false, d_dtype, std::nullopt, false, std::nullopt),
          n, dy.scalar_type());
    }
  }
  if (bgrad) db = dy.sum(0, /*keepdim=*/false, at::kFloat).to(dy.scalar_type());
  return {or_empty(dx, opts), or_empty(dw, opts), or_empty(db, opts)};
}

void register_block_linear_kernels(torch::Library& m) {
  m.impl("block_linear_forward", &block_linear_forward_op);
  m.impl("block_linear_backward", &block_linear_backward_op);
}

}  // namespace
}  // namespace fp8kit_torch

TORCH_LIBRARY_FRAGMENT(fp8kit, m) {
  m.def(
      "block_linear_forward(Tensor x, Tensor weight, Tensor? bias, ScalarType forward_dtype, "
      "float amax_epsilon, bool power_2_scale, bool dgrad, bool wgrad, int min_rows, "
      "Tensor(a!)? statistics=None) -> (Tensor out, Tensor x_columnwise, Tensor "
      "x_columnwise_scale_inv, Tensor w_columnwise, Tensor w_columnwise_scale_inv)");
  m.def(
      "block_linear_backward(Tensor grad_output, Tensor x_columnwise, Tensor "
      "x_columnwise_scale_inv, Tensor w_columnwise, Tensor w_columnwise_scale_inv, ScalarType "
      "backward_dtype, float amax_epsilon, bool power_2_scale, int in_features, bool dgrad, "
      "bool wgrad, bool bgrad, int min_rows, Tensor(a!)? statistics=None) -> (Tensor "
      "grad_input, Tensor grad_weight, Tensor grad_bias)");
}

TORCH_LIBRARY_IMPL(fp8kit, CPU, m) { fp8kit_torch::register_block_linear_kernels(m); }

#ifdef FP8KIT_TORCH_CUDA
TORCH_LIBRARY_IMPL(fp8kit, CUDA, m) { fp8kit_torch::register_block_linear_kernels(m); }
#endif
