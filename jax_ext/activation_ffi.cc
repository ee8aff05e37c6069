// FFI handlers for GELU/SwiGLU (fp8kit/activation.h) with the FP8 cast of
// their outputs fused in, by cast recipe (fused_cast_ffi.h):
//   forward:  fp8kit_activation_forward_delayed_update,
//             fp8kit_activation_forward_delayed, fp8kit_activation_forward_current
//             (a = act(h) as the second GEMM's FP8 input);
//   backward: fp8kit_activation_backward_delayed_update,
//             fp8kit_activation_backward_current
//             (dh = d_a * act'(h) as the first GEMM's FP8 output gradient, with
//             the column sums of dh, the first GEMM's bias gradient, on request).
// The high-precision a or dh is written only when the optional last result
// is given (fused_cast_ffi.h).
// The backward always records under delayed scaling (it is the pass that
// computes gradients), so it has no read-only target.
#include <optional>
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "fused_cast_ffi.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kForwardUpdate[] = "fp8kit_activation_forward_delayed_update";
constexpr char kForwardRead[] = "fp8kit_activation_forward_delayed";
constexpr char kForwardCurrent[] = "fp8kit_activation_forward_current";
constexpr char kBackwardUpdate[] = "fp8kit_activation_backward_delayed_update";
constexpr char kBackwardCurrent[] = "fp8kit_activation_backward_current";

// The static description of an activation call (attributes).
struct ActAttrs {
  int32_t act;      // fp8kit_activation
  bool rowwise;     // write the FP8 output's rowwise data
  bool columnwise;  // write its columnwise (transposed) data
};

// h and the FP8 output of v (a in the forward, dh in the backward; the
// output's shape is checked by the core, it is taken from `v_shape`), and
// v in h's dtype when asked for.
struct Tensors {
  fp8kit_tensor h, d_a, out;
  std::optional<fp8kit_tensor> v;
  int64_t rows, cols;  // v's 2-D view
};

ffi::ErrorOr<Tensors> DescribeTensors(const char* op, const Device& device, ffi::AnyBuffer h,
                                      const ffi::AnyBuffer* d_a, ffi::AnyBuffer data,
                                      ffi::AnyBuffer columnwise, const HighPrecisionResult& hp,
                                      const ActAttrs& a) {
  Tensors t{};
  auto hd = Describe(op, "h", h, device);
  if (hd.has_error()) return ffi::Unexpected(hd.error());
  t.h = *hd;
  if (d_a != nullptr) {
    auto dd = Describe(op, "d_a", *d_a, device);
    if (dd.has_error()) return ffi::Unexpected(dd.error());
    t.d_a = *dd;
  }
  // v is a [rows, F] in the forward and dh (h's shape) in the backward.
  fp8kit_tensor v = t.h;
  if (d_a == nullptr && a.act == FP8KIT_SWIGLU && v.rank > 0) v.shape[v.rank - 1] /= 2;
  auto out = DescribeFp8Output(op, v, data, columnwise, a.rowwise, a.columnwise);
  if (out.has_error()) return ffi::Unexpected(out.error());
  t.out = *out;
  auto vd = DescribeHighPrecision(op, d_a == nullptr ? "a" : "dh", hp, device);
  if (vd.has_error()) return ffi::Unexpected(vd.error());
  t.v = *vd;
  t.cols = v.rank > 0 ? v.shape[v.rank - 1] : 1;
  t.rows = t.cols > 0 ? fp8kit_tensor_numel(&v) / t.cols : 0;
  return t;
}

// --- forward ----------------------------------------------------------------------------

ffi::Error ForwardDelayed(const char* op, const Device& device, const DelayedState& state,
                          const StateResults* results, ffi::AnyBuffer h,
                          ffi::AnyBuffer workspace, ffi::AnyBuffer data,
                          ffi::AnyBuffer columnwise, F32Buffer* scale_inv,
                          const HighPrecisionResult& hp, const DelayedAttrs& d,
                          const ActAttrs& a) {
  auto t = DescribeTensors(op, device, h, nullptr, data, columnwise, hp, a);
  if (t.has_error()) return t.error();
  if (auto err = SetScaleInv(op, &t->out, scale_inv); err.failure()) return err;
  CastWorkspace scratch(t->rows, t->cols, false, FP8KIT_FUSED_CAST_DELAYED);
  if (auto err = scratch.Bind(op, device, workspace); err.failure()) return err;
  auto cast = scratch.Delayed(op, device, state, results, d);
  if (cast.has_error()) return cast.error();
  return FromStatus(fp8kit_activation_forward(static_cast<fp8kit_activation>(a.act), &t->h,
                                              Pointer(t->v), &t->out, &*cast, device.stream));
}

ffi::Error ForwardDelayedUpdateImpl(
    const Device& device, F32Buffer history, F32Buffer scale, F32Buffer seeded, F32Buffer amax,
    ffi::AnyBuffer h, ffi::Result<F32Buffer> history_out, ffi::Result<F32Buffer> scale_out,
    ffi::Result<F32Buffer> seeded_out, ffi::Result<ffi::AnyBuffer> workspace,
    ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> columnwise,
    ffi::Result<F32Buffer> scale_inv, HighPrecisionResult a, int64_t slot, int32_t margin,
    int32_t amax_reduction, int32_t act, bool rowwise, bool want_columnwise) {
  const StateResults results{&*history_out, &*scale_out, &*seeded_out};
  return ForwardDelayed(kForwardUpdate, device, {history, scale, seeded, amax}, &results, h,
                        *workspace, *data, *columnwise, &*scale_inv, a,
                        {slot, margin, amax_reduction}, {act, rowwise, want_columnwise});
}

ffi::Error ForwardDelayedImpl(const Device& device, F32Buffer history, F32Buffer scale,
                              F32Buffer seeded, F32Buffer amax, ffi::AnyBuffer h,
                              ffi::Result<ffi::AnyBuffer> workspace,
                              ffi::Result<ffi::AnyBuffer> data,
                              ffi::Result<ffi::AnyBuffer> columnwise,
                              ffi::Result<F32Buffer> scale_inv, HighPrecisionResult a,
                              int64_t slot, int32_t margin, int32_t amax_reduction, int32_t act,
                              bool rowwise, bool want_columnwise) {
  return ForwardDelayed(kForwardRead, device, {history, scale, seeded, amax}, nullptr, h,
                        *workspace, *data, *columnwise, &*scale_inv, a,
                        {slot, margin, amax_reduction}, {act, rowwise, want_columnwise});
}

ffi::Error ForwardCurrentImpl(const Device& device, ffi::AnyBuffer h,
                              ffi::Result<ffi::AnyBuffer> data,
                              ffi::Result<ffi::AnyBuffer> columnwise,
                              ffi::Result<F32Buffer> scale, ffi::Result<F32Buffer> scale_inv,
                              ffi::Result<F32Buffer> amax, HighPrecisionResult a_out,
                              float amax_epsilon, bool power_2_scale, int32_t act, bool rowwise,
                              bool want_columnwise) {
  const ActAttrs a{act, rowwise, want_columnwise};
  auto t = DescribeTensors(kForwardCurrent, device, h, nullptr, *data, *columnwise, a_out, a);
  if (t.has_error()) return t.error();
  auto cast = CurrentCast(kForwardCurrent, &t->out, &*scale, &*scale_inv, &*amax, amax_epsilon,
                          power_2_scale);
  if (cast.has_error()) return cast.error();
  return FromStatus(fp8kit_activation_forward(static_cast<fp8kit_activation>(act), &t->h,
                                              Pointer(t->v), &t->out, &*cast, device.stream));
}

// --- backward ---------------------------------------------------------------------------

// The backward after its cast is built: with the column sums when asked.
ffi::Error RunBackward(const char* op, const Device& device, Tensors& t,
                       const fp8kit_fused_cast& cast, const CastWorkspace& scratch,
                       ffi::AnyBuffer sums, bool want_sums, int32_t act) {
  fp8kit_column_sums column_sums{};
  if (want_sums) {
    auto s = scratch.ColumnSums(op, sums);
    if (s.has_error()) return s.error();
    column_sums = *s;
  }
  return FromStatus(fp8kit_activation_backward(static_cast<fp8kit_activation>(act), &t.d_a, &t.h,
                                               Pointer(t.v), &t.out, &cast,
                                               want_sums ? &column_sums : nullptr,
                                               device.stream));
}

ffi::Error BackwardDelayedUpdateImpl(
    const Device& device, F32Buffer history, F32Buffer scale, F32Buffer seeded, F32Buffer amax,
    ffi::AnyBuffer d_a, ffi::AnyBuffer h, ffi::Result<F32Buffer> history_out,
    ffi::Result<F32Buffer> scale_out, ffi::Result<F32Buffer> seeded_out,
    ffi::Result<ffi::AnyBuffer> workspace, ffi::Result<ffi::AnyBuffer> data,
    ffi::Result<ffi::AnyBuffer> columnwise, ffi::Result<ffi::AnyBuffer> sums,
    ffi::Result<F32Buffer> scale_inv, HighPrecisionResult dh, int64_t slot, int32_t margin,
    int32_t amax_reduction, int32_t act, bool rowwise, bool want_columnwise, bool want_sums) {
  const char* op = kBackwardUpdate;
  auto t = DescribeTensors(op, device, h, &d_a, *data, *columnwise, dh,
                           {act, rowwise, want_columnwise});
  if (t.has_error()) return t.error();
  if (auto err = SetScaleInv(op, &t->out, &*scale_inv); err.failure()) return err;
  CastWorkspace scratch(t->rows, t->cols, want_sums, FP8KIT_FUSED_CAST_DELAYED);
  if (auto err = scratch.Bind(op, device, *workspace); err.failure()) return err;
  const StateResults results{&*history_out, &*scale_out, &*seeded_out};
  auto cast = scratch.Delayed(op, device, {history, scale, seeded, amax}, &results,
                              {slot, margin, amax_reduction});
  if (cast.has_error()) return cast.error();
  return RunBackward(op, device, *t, *cast, scratch, *sums, want_sums, act);
}

ffi::Error BackwardCurrentImpl(const Device& device, ffi::AnyBuffer d_a, ffi::AnyBuffer h,
                               ffi::Result<ffi::AnyBuffer> workspace,
                               ffi::Result<ffi::AnyBuffer> data,
                               ffi::Result<ffi::AnyBuffer> columnwise,
                               ffi::Result<ffi::AnyBuffer> sums, ffi::Result<F32Buffer> scale,
                               ffi::Result<F32Buffer> scale_inv, ffi::Result<F32Buffer> amax,
                               HighPrecisionResult dh, float amax_epsilon, bool power_2_scale,
                               int32_t act, bool rowwise, bool want_columnwise, bool want_sums) {
  const char* op = kBackwardCurrent;
  auto t = DescribeTensors(op, device, h, &d_a, *data, *columnwise, dh,
                           {act, rowwise, want_columnwise});
  if (t.has_error()) return t.error();
  CastWorkspace scratch(t->rows, t->cols, want_sums, FP8KIT_FUSED_CAST_CURRENT);
  if (auto err = scratch.Bind(op, device, *workspace); err.failure()) return err;
  auto cast = CurrentCast(op, &t->out, &*scale, &*scale_inv, &*amax, amax_epsilon,
                          power_2_scale);
  if (cast.has_error()) return cast.error();
  return RunBackward(op, device, *t, *cast, scratch, *sums, want_sums, act);
}

// --- bindings ---------------------------------------------------------------------------

template <typename Binding>
auto BindOutput(Binding&& binding) {
  return std::move(binding)
      .template Ret<ffi::AnyBuffer>()   // workspace: uint8, ScratchLayout's bytes
      .template Ret<ffi::AnyBuffer>()   // data: FP8, v's shape (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>();  // columnwise: FP8 [cols, rows] of v (or (0,))
}

template <typename Binding>
auto BindActAttrs(Binding&& binding) {
  return std::move(binding)
      .template Attr<int32_t>("activation")  // activation: fp8kit_activation code
      .template Attr<bool>("rowwise")        // rowwise: write `data`
      .template Attr<bool>("columnwise");    // columnwise: write `columnwise`
}

template <typename Binding>
auto BindH(Binding&& binding) {
  // h: [..., F] (GELU) or [..., 2F] = [gate | up] (SwiGLU), float32/bfloat16/float16
  return std::move(binding).template Arg<ffi::AnyBuffer>();
}

template <typename Binding>
auto BindDaH(Binding&& binding) {
  return BindH(std::move(binding).template Arg<ffi::AnyBuffer>());  // d_a: [..., F], h's dtype
}

// Each target's last result is the optional v in h's dtype (a: [rows, F];
// dh: h's shape), the values cast.
template <typename Binding>
auto BindForwardDelayedUpdate(Binding binding) {
  return BindActAttrs(BindDelayedAttrs(BindHighPrecision(  // a, or absent
      BindOutput(BindStateResults(BindH(BindDelayedStateArgs(std::move(binding)))))
          .template Ret<F32Buffer>())));  // scale_inv: 1 / the scale used
}

template <typename Binding>
auto BindForwardDelayed(Binding binding) {
  return BindActAttrs(BindDelayedAttrs(BindHighPrecision(  // a, or absent
      BindOutput(BindH(BindDelayedStateArgs(std::move(binding))))
          .template Ret<F32Buffer>())));  // scale_inv: 1 / the scale used
}

template <typename Binding>
auto BindForwardCurrent(Binding binding) {
  return BindActAttrs(BindCurrentAttrs(BindHighPrecision(  // a, or absent
      BindH(std::move(binding))
          .template Ret<ffi::AnyBuffer>()  // data
          .template Ret<ffi::AnyBuffer>()  // columnwise
          .template Ret<F32Buffer>()       // scale
          .template Ret<F32Buffer>()       // scale_inv
          .template Ret<F32Buffer>())));   // amax: max |a|
}

template <typename Binding>
auto BindBackwardDelayedUpdate(Binding binding) {
  return BindActAttrs(BindDelayedAttrs(BindHighPrecision(  // dh, or absent
                          BindOutput(BindStateResults(
                                         BindDaH(BindDelayedStateArgs(std::move(binding)))))
                              .template Ret<ffi::AnyBuffer>()  // sums: [cols] of dh, or (0,)
                              .template Ret<F32Buffer>())))    // scale_inv: 1 / the scale used
      .template Attr<bool>("sums");  // sums: write the column sums of dh
}

template <typename Binding>
auto BindBackwardCurrent(Binding binding) {
  return BindActAttrs(BindCurrentAttrs(BindHighPrecision(  // dh, or absent
                          BindOutput(BindDaH(std::move(binding)))
                              .template Ret<ffi::AnyBuffer>()  // sums, or (0,)
                              .template Ret<F32Buffer>()       // scale
                              .template Ret<F32Buffer>()       // scale_inv
                              .template Ret<F32Buffer>())))    // amax: max |dh|
      .template Attr<bool>("sums");  // sums: write the column sums of dh
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(activation_forward_delayed_update, fp8kit_jax::ForwardDelayedUpdateImpl,
                   fp8kit_jax::BindForwardDelayedUpdate);
FP8KIT_JAX_HANDLER(activation_forward_delayed, fp8kit_jax::ForwardDelayedImpl,
                   fp8kit_jax::BindForwardDelayed);
FP8KIT_JAX_HANDLER(activation_forward_current, fp8kit_jax::ForwardCurrentImpl,
                   fp8kit_jax::BindForwardCurrent);
FP8KIT_JAX_HANDLER(activation_backward_delayed_update, fp8kit_jax::BackwardDelayedUpdateImpl,
                   fp8kit_jax::BindBackwardDelayedUpdate);
FP8KIT_JAX_HANDLER(activation_backward_current, fp8kit_jax::BackwardCurrentImpl,
                   fp8kit_jax::BindBackwardCurrent);
