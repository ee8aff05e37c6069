// The FP8 Linear's backward: quantize grad_output, the dgrad and wgrad FP8
// GEMMs from the FP8 copies forward saved, and the bias gradient.
#include <cstdint>
#include <mutex>
#include <vector>

#include "carve.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "linear_autograd.h"

using torch::autograd::variable_list;

namespace fp8kit_torch {
namespace {

// [rows, cols] FP8 data zero-padded to [rows, cols_padded] (zeros add
// nothing to the wgrad sum over tokens).
at::Tensor pad_columns(const at::Tensor& t, int64_t cols_padded) {
  if (t.size(1) == cols_padded) return t;
  at::Tensor p = at::zeros({t.size(0), cols_padded}, t.options().dtype(at::kByte));
  p.narrow(1, 0, t.size(1)).copy_(t.view(at::kByte));
  return p.view(t.scalar_type());
}

}  // namespace

// `p`: info.call narrowed to the gradients this backward computes, with
// the plan for those (which copies dy's cast writes); the saved copies are
// those of forward's plan, info.call.plan.
variable_list linear_backward_below_autograd(const BackwardInfo& info, const LinearCall& p,
                                             const variable_list& saved,
                                             const at::Tensor& dy_in) {
  LinearState& st = *info.st;
  const fp8kit_linear_plan& fwd_plan = info.call.plan;
  const at::Tensor& x_q = saved[0];
  const at::Tensor& x_scalars = saved[1];
  const at::Tensor& w_q = saved[2];
  const at::Tensor& w_scalars = saved[3];
  DeviceScope scope(st.device);
  const auto dev_type = st.device.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
  const fp8kit_dtype fwd = st.recipe.forward_dtype, bwd = st.recipe.backward_dtype;
  const at::Tensor dy = dy_in.contiguous();
  const at::TensorOptions opts = dy.options();
  at::Tensor dx, dw, db;

  if (p.m == 0) {  // no tokens: every gradient is zero
    if (p.dgrad) dx = at::zeros(info.x_sizes, opts.dtype(info.x_dtype));
    if (p.wgrad) dw = at::zeros({p.n, p.k}, opts.dtype(info.w_dtype));
    if (p.bgrad) db = at::zeros({p.n}, opts.dtype(info.b_dtype));
    return {dx, dw, db};
  }

  if (p.dgrad || p.wgrad) {
    const fp8kit_copies dy_cast = p.plan.quantize[kGrad];
    const at::ScalarType fp8 = torch_fp8_type(bwd);
    const std::vector<int64_t> dy_cw =
        dy_cast.columnwise ? columnwise_shape(dy.sizes()) : std::vector<int64_t>();
    const int64_t scalars_shape[1] = {kScalars};
    // The bias gradient (dy's column sums in the core's order, the same
    // bits as the JAX front end) comes out of dy's cast, with no pass of its
    // own, whenever that cast is the cast+transpose pass (a columnwise copy
    // of a dy with more than one row and column); otherwise one reduction
    // below.
    const bool sums_in_cast = p.bgrad && dy_cast.columnwise && p.m > 1 && p.n > 1;
    const int64_t partials_shape[1] = {sums_in_cast ? fp8kit_column_sums_workspace(p.m, p.n) : 0};
    // All are used only in this backward: one lifetime, one buffer.
    const Piece pieces[4] = {{dy_cast.rowwise != 0, fp8, dy.sizes(), 0},
                             {dy_cast.columnwise != 0, fp8, dy_cw, 0},
                             {true, at::kFloat, scalars_shape, 0},
                             {sums_in_cast, at::kFloat, partials_shape, 0}};
    at::Tensor t[4];
    carve(dy.device(), pieces, 4, t);
    const at::Tensor& dy_data = t[0];
    const at::Tensor& dy_columnwise = t[1];
    const at::Tensor& dy_scalars = t[2];
    if (sums_in_cast) db = at::empty({p.n}, opts.dtype(info.b_dtype));
    {
      // The delayed-scaling state and the column sums' tile counters are
      // the layer's; current scaling without sums touches neither.
      std::unique_lock<std::mutex> lock;
      if (st.recipe.delayed || sums_in_cast) lock = lock_state(st.mu);
      SlotJob job{kGrad, &dy, dy_data, dy_columnwise, dy_scalars.data_ptr<float>()};
      if (sums_in_cast) {
        job.sums = {db.data_ptr(), *high_precision_dtype(info.b_dtype), t[3].data_ptr<float>(),
                    st.sum_counters_for(p.n)};
      }
      st.quantize_slots(&job, 1, /*record=*/true);
    }
    if (p.statistics.defined()) {  // an inspected call: whichever copy the cast wrote
      const bool rowwise = dy_cast.rowwise != 0;
      record_statistics(p.statistics, kGrad, dy, bwd, rowwise ? dy_data : dy_columnwise,
                        !rowwise, dy_scalars);
    }
    if (p.dgrad) {
      // dx[M, K] = dy[M, N] @ w[N, K]: w is read N-contiguous, from its
      // columnwise copy on TN-only devices (whichever copy forward kept).
      dx = at::empty(info.x_sizes, opts.dtype(info.x_dtype));
      const bool w_rowwise = fwd_plan.saved_weight.rowwise != 0;
      const fp8kit_tensor a = gemm_operand(st.device, bwd, p.m, p.n, dy_data.data_ptr(), nullptr,
                                           scale_inv_of(dy_scalars));
      const fp8kit_tensor b = gemm_operand(st.device, fwd, p.n, p.k,
                                           w_rowwise ? w_q.data_ptr() : nullptr,
                                           w_rowwise ? nullptr : w_q.data_ptr(),
                                           scale_inv_of(w_scalars));
      fp8kit_tensor d = describe(dx, *high_precision_dtype(info.x_dtype), dev_type);
      fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
      cfg.trans_a = 0;
      cfg.trans_b = 0;
      gemm_call(a, b, d, cfg, st.device);
    }
    if (p.wgrad) {
      // dw[N, K] = dy[M, N]^T @ x[M, K]: the token dimension M is the inner
      // one. With wgrad_columnwise: the columnwise copies, M zero-padded to
      // wgrad_inner; otherwise the rowwise data, read transposed. Both stay
      // alive until the GEMM below has been enqueued.
      dw = at::empty({p.n, p.k}, opts.dtype(info.w_dtype));
      const bool cw = fwd_plan.wgrad_columnwise != 0;
      const int64_t inner = fwd_plan.wgrad_inner;
      const at::Tensor dy_w = cw ? pad_columns(dy_columnwise, inner) : dy_data;
      const at::Tensor x_w = cw ? pad_columns(x_q, inner) : x_q;
      void* dy_ptr = dy_w.data_ptr();
      void* x_ptr = x_w.data_ptr();
      const fp8kit_tensor a = gemm_operand(st.device, bwd, inner, p.n, cw ? nullptr : dy_ptr,
                                           cw ? dy_ptr : nullptr, scale_inv_of(dy_scalars));
      const fp8kit_tensor b = gemm_operand(st.device, fwd, inner, p.k, cw ? nullptr : x_ptr,
                                           cw ? x_ptr : nullptr, scale_inv_of(x_scalars));
      fp8kit_tensor d = describe(dw, *high_precision_dtype(info.w_dtype), dev_type);
      fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
      cfg.trans_a = 1;
      cfg.trans_b = 0;
      gemm_call(a, b, d, cfg, st.device);
    }
  }
  if (p.bgrad && !db.defined()) {
    // One reduction kernel (accumulating in float32) straight into the
    // bias dtype.
    const at::Tensor dy2 = dy.view({p.m, p.n});
    db = info.b_dtype == dy.scalar_type() ? dy2.sum(0) : dy2.sum(0, false, info.b_dtype);
  }
  return {dx, dw, db};
}

variable_list LinearBackward::apply(variable_list&& grads) {
  FP8KIT_PROFILE_SCOPE("fp8kit::linear_backward");
  if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};  // y unused
  const variable_list saved = {x_q.unpack(), x_scalars.unpack(), w_q.unpack(), w_scalars.unpack()};
  LinearCall call = info.call;  // only the gradients this backward asks for
  call.dgrad = call.dgrad && task_should_compute_output(0);
  call.wgrad = call.wgrad && task_should_compute_output(1);
  call.bgrad = call.bgrad && task_should_compute_output(2);
  if (call.dgrad != info.call.dgrad || call.wgrad != info.call.wgrad) {
    call.plan = linear_plan(call);
  }
  at::NoGradGuard no_grad;
  return linear_backward_below_autograd(info, call, saved, grads[0]);
}

void LinearBackward::release_variables() {
  x_q.reset_data();
  x_scalars.reset_data();
  w_q.reset_data();
  w_scalars.reset_data();
}

}  // namespace fp8kit_torch
