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
                                             const at::Tensor& dy_in,
                                             const CastInput* cast_dy) {
  LinearState& st = *info.st;
  const fp8kit_linear_plan& fwd_plan = info.call.plan;
  const at::Tensor& x_q = saved[0];
  const at::Tensor& x_scale_inv = saved[1];
  const at::Tensor& w_q = saved[2];
  const at::Tensor& w_scale_inv = saved[3];
  DeviceScope scope(st.device);
  const auto dev_type = st.device.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
  const fp8kit_dtype fwd = st.recipe.forward_dtype, bwd = st.recipe.backward_dtype;
  const at::Tensor dy = cast_dy != nullptr ? at::Tensor() : dy_in.contiguous();
  const at::TensorOptions opts = at::TensorOptions().device(st.device);
  at::Tensor dx, dw, db;

  if (p.m == 0) {  // no tokens: every gradient is zero
    if (p.dgrad) dx = at::zeros(info.x_sizes, opts.dtype(info.x_dtype));
    if (p.wgrad) dw = at::zeros({p.n, p.k}, opts.dtype(info.w_dtype));
    if (p.bgrad) db = at::zeros({p.n}, opts.dtype(info.b_dtype));
    return {dx, dw, db};
  }

  if (p.dgrad || p.wgrad) {
    at::Tensor dy_data, dy_columnwise;
    ScaleInv dy_scale_inv;
    if (cast_dy != nullptr) {
      dy_data = cast_dy->data;
      dy_columnwise = cast_dy->columnwise_data;
      dy_scale_inv = ScaleInv{cast_dy->scale_inv, false};
    } else {
      const fp8kit_copies dy_cast = p.plan.quantize[kGrad];
      const at::ScalarType fp8 = torch_fp8_type(bwd);
      const std::vector<int64_t> dy_cw =
          dy_cast.columnwise ? columnwise_shape(dy.sizes()) : std::vector<int64_t>();
      const int64_t scalars_shape[1] = {kScalars};
      // The bias gradient (dy's column sums in the core's order, the same
      // bits as the JAX front end) comes out of dy's cast, with no pass of
      // its own, whenever that cast is the cast+transpose pass (a columnwise
      // copy of a dy with more than one row and column); otherwise one
      // reduction below.
      const bool sums_in_cast = p.bgrad && dy_cast.columnwise && p.m > 1 && p.n > 1;
      const int64_t partials_shape[1] = {
          sums_in_cast ? fp8kit_column_sums_workspace(p.m, p.n) : 0};
      // All are used only in this backward: one lifetime, one buffer.
      const Piece pieces[4] = {{dy_cast.rowwise != 0, fp8, dy.sizes(), 0},
                               {dy_cast.columnwise != 0, fp8, dy_cw, 0},
                               {true, at::kFloat, scalars_shape, 0},
                               {sums_in_cast, at::kFloat, partials_shape, 0}};
      at::Tensor t[4];
      carve(dy.device(), pieces, 4, t);
      dy_data = t[0];
      dy_columnwise = t[1];
      dy_scale_inv = ScaleInv{t[2], true};
      if (sums_in_cast) db = at::empty({p.n}, opts.dtype(info.b_dtype));
      {
        // The delayed-scaling state and the column sums' tile counters are
        // the layer's; current scaling without sums touches neither.
        std::unique_lock<std::mutex> lock;
        if (st.recipe.delayed || sums_in_cast) lock = lock_state(st.mu);
        SlotJob job{kGrad, &dy, dy_data, dy_columnwise, t[2].data_ptr<float>()};
        if (sums_in_cast) {
          job.sums = {db.data_ptr(), *high_precision_dtype(info.b_dtype), t[3].data_ptr<float>(),
                      st.sum_counters_for(p.n)};
        }
        st.quantize_slots(&job, 1, /*record=*/true);
      }
    }
    const at::Tensor& dy_values = cast_dy != nullptr ? cast_dy->values : dy;
    if (p.statistics.defined() && dy_values.defined()) {
      // An inspected call: whichever copy the cast wrote.
      const bool rowwise = dy_data.defined() && dy_data.numel() > 0;
      record_statistics(p.statistics, kGrad, dy_values, bwd, rowwise ? dy_data : dy_columnwise,
                        !rowwise, dy_scale_inv.tensor());
    }
    if (p.dgrad) {
      // dx[M, K] = dy[M, N] @ w[N, K]: w is read N-contiguous, from its
      // columnwise copy on TN-only devices (whichever copy forward kept).
      dx = at::empty(info.x_sizes, opts.dtype(info.x_dtype));
      const bool w_rowwise = fwd_plan.saved_weight.rowwise != 0;
      const fp8kit_tensor a = gemm_operand(st.device, bwd, p.m, p.n, dy_data.data_ptr(), nullptr,
                                           dy_scale_inv.ptr());
      const fp8kit_tensor b = gemm_operand(st.device, fwd, p.n, p.k,
                                           w_rowwise ? w_q.data_ptr() : nullptr,
                                           w_rowwise ? nullptr : w_q.data_ptr(),
                                           w_scale_inv.data_ptr<float>());
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
                                           cw ? dy_ptr : nullptr, dy_scale_inv.ptr());
      const fp8kit_tensor b = gemm_operand(st.device, fwd, inner, p.k, cw ? nullptr : x_ptr,
                                           cw ? x_ptr : nullptr, x_scale_inv.data_ptr<float>());
      fp8kit_tensor d = describe(dw, *high_precision_dtype(info.w_dtype), dev_type);
      fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
      cfg.trans_a = 1;
      cfg.trans_b = 0;
      gemm_call(a, b, d, cfg, st.device);
    }
  }
  if (p.bgrad && !db.defined() && cast_dy == nullptr) {
    // One reduction kernel (accumulating in float32) straight into the
    // bias dtype.
    const at::Tensor dy2 = dy.view({p.m, p.n});
    db = info.b_dtype == dy.scalar_type() ? dy2.sum(0) : dy2.sum(0, false, info.b_dtype);
  }
  return {dx, dw, db};
}

namespace {

void check_on(const char* fn, const char* arg, const at::Tensor& t, const LinearState& st) {
  FP8KIT_VALUE_CHECK(t.device() == st.device, fn, ": ", arg, " is on ", device_str(t.device()),
                     " but the layer's FP8 scaling state is on ", device_str(st.device),
                     "; pass the tensors of this layer's own forward");
}

// A kept FP8 copy and its scale_inv, when the backward reads them.
void check_kept(const char* fn, const char* data_name, const at::Tensor& data,
                const char* scale_inv_name, const at::Tensor& scale_inv, const LinearState& st) {
  check_fp8(fn, data_name, data);
  check_on(fn, data_name, data, st);
  FP8KIT_VALUE_CHECK(scale_inv.scalar_type() == at::kFloat && scale_inv.numel() == 1, fn, ": ",
                     scale_inv_name, " is ", dtype_str(scale_inv.scalar_type()), " of shape ",
                     shape_str(scale_inv.sizes()), "; pass what the forward returned");
  check_on(fn, scale_inv_name, scale_inv, st);
}

// dy's cast copy `t` ([rows, cols] in the backward format) when `needed`.
void check_cast_dy(const char* fn, const char* arg, const at::Tensor& t, bool needed,
                   int64_t rows, int64_t cols, const LinearState& st) {
  if (!needed) return;
  FP8KIT_VALUE_CHECK(t.defined() && t.numel() > 0, fn, ": ", arg, " is missing, but this ",
                     "backward's GEMMs read it; cast grad_output with the copies the plan names");
  check_dense(fn, arg, t);
  FP8KIT_TYPE_CHECK(check_fp8(fn, arg, t) == st.recipe.backward_dtype, fn, ": ", arg, " is ",
                    dtype_str(t.scalar_type()), " but the recipe's backward format is ",
                    dtype_str(torch_fp8_type(st.recipe.backward_dtype)));
  FP8KIT_VALUE_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, fn, ": ", arg,
                     " has shape ", shape_str(t.sizes()), " but this call needs [", rows, ", ",
                     cols, "]");
  check_contiguous(fn, arg, t);
  check_on(fn, arg, t, st);
}

}  // namespace

LinearGrads linear_backward_saved(const char* fn, c10::intrusive_ptr<LinearState> st,
                                  const at::Tensor& dy, const CastInput* cast_dy,
                                  const SavedCopies& saved, at::IntArrayRef input_shape,
                                  int64_t out_features, at::ScalarType dtype, bool forward_dgrad,
                                  bool forward_wgrad, bool dgrad, bool wgrad, bool bgrad,
                                  const at::Tensor& statistics,
                                  std::optional<at::ScalarType> weight_dtype) {
  FP8KIT_VALUE_CHECK(!input_shape.empty() && input_shape.back() > 0 && out_features > 0, fn,
                     ": input_shape is ", shape_str(input_shape), " and out_features ",
                     out_features, "; pass the forward input's shape and the layer's N");
  FP8KIT_VALUE_CHECK(!dgrad || forward_dgrad, fn,
                     ": dgrad is True but the forward kept no weight copy for it "
                     "(forward_dgrad is False)");
  FP8KIT_VALUE_CHECK(!wgrad || forward_wgrad, fn,
                     ": wgrad is True but the forward kept no input copy for it "
                     "(forward_wgrad is False)");
  FP8KIT_VALUE_CHECK(cast_dy == nullptr || !bgrad, fn,
                     ": a cast grad_output comes without the bias gradient; take it with the "
                     "cast (its column sums)");
  if (wgrad) check_kept(fn, "input_fp8", saved.x_q, "input_scale_inv", saved.x_scale_inv, *st);
  if (dgrad) check_kept(fn, "weight_fp8", saved.w_q, "weight_scale_inv", saved.w_scale_inv, *st);
  check_statistics(fn, statistics, st->device);
  BackwardInfo info;
  info.st = st;
  info.x_dtype = info.b_dtype = dtype;
  info.w_dtype = weight_dtype.value_or(dtype);
  FP8KIT_TYPE_CHECK(high_precision_dtype(info.w_dtype).has_value(), fn, ": weight_dtype is ",
                    dtype_str(info.w_dtype), "; use float32, bfloat16 or float16");
  info.x_sizes = input_shape.vec();
  LinearCall& fwd = info.call;
  fwd.n = out_features;
  fwd.k = input_shape.back();
  fwd.m = c10::multiply_integers(input_shape.begin(), input_shape.end() - 1);
  fwd.dgrad = forward_dgrad;
  fwd.wgrad = forward_wgrad;
  fwd.non_tn = st->non_tn;
  fwd.plan = linear_plan(fwd);
  LinearCall call = fwd;
  call.dgrad = dgrad;
  call.wgrad = wgrad;
  call.bgrad = bgrad;
  call.statistics = statistics;
  if (call.dgrad != fwd.dgrad || call.wgrad != fwd.wgrad) call.plan = linear_plan(call);
  if (cast_dy == nullptr) {
    check_high_precision(fn, "grad_output", dy);
    check_on(fn, "grad_output", dy, *st);
    FP8KIT_VALUE_CHECK(dy.dim() >= 1 && dy.size(-1) == call.n && dy.numel() == call.m * call.n,
                       fn, ": grad_output has shape ", shape_str(dy.sizes()), " but the output ",
                       "of an input of shape ", shape_str(input_shape), " has ", call.n,
                       " features and ", call.m, " rows");
  } else if (call.m > 0 && (dgrad || wgrad)) {
    const fp8kit_copies need = call.plan.quantize[kGrad];
    check_cast_dy(fn, "grad_output_fp8", cast_dy->data, need.rowwise != 0, call.m, call.n, *st);
    check_cast_dy(fn, "grad_output_columnwise", cast_dy->columnwise_data,
                  need.columnwise != 0, call.n, call.m, *st);
    check_f32_scalar(fn, "grad_output_scale_inv", cast_dy->scale_inv, "the state",
                     need.rowwise ? cast_dy->data : cast_dy->columnwise_data);
  }
  const variable_list out = linear_backward_below_autograd(
      info, call, {saved.x_q, saved.x_scale_inv, saved.w_q, saved.w_scale_inv}, dy, cast_dy);
  return {out[0], out[1], out[2]};
}

variable_list LinearBackward::apply(variable_list&& grads) {
  FP8KIT_PROFILE_SCOPE("fp8kit::linear_backward");
  if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};  // y unused
  const variable_list saved = {x_q.unpack(), x_scale_inv.unpack(), w_q.unpack(),
                               w_scale_inv.unpack()};
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
  x_scale_inv.reset_data();
  w_q.reset_data();
  w_scale_inv.reset_data();
}

}  // namespace fp8kit_torch
