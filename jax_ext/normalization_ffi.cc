// FFI handlers for LayerNorm/RMSNorm (fp8kit/normalization.h): the forward
// writes the next GEMM's FP8 input directly, and its high-precision output
// y only when given the optional last result (fused_cast_ffi.h), in three
// targets by cast recipe (fused_cast_ffi.h):
//   fp8kit_norm_forward_delayed_update, fp8kit_norm_forward_delayed,
//   fp8kit_norm_forward_current;
// and fp8kit_norm_backward (dx, dgamma, dbeta).
//
// Operands not used by RMSNorm (beta, mean, dbeta) are (0,) placeholders,
// so that each target has one fixed signature.
#include <optional>
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "fused_cast_ffi.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kForwardUpdate[] = "fp8kit_norm_forward_delayed_update";
constexpr char kForwardRead[] = "fp8kit_norm_forward_delayed";
constexpr char kForwardCurrent[] = "fp8kit_norm_forward_current";
constexpr char kBackward[] = "fp8kit_norm_backward";

// The static description of a norm call (attributes).
struct NormAttrs {
  int32_t type;   // fp8kit_norm_type
  float epsilon;
  bool rowwise;     // write the FP8 output's rowwise data
  bool columnwise;  // write its columnwise (transposed) data
};

fp8kit_norm_config Config(const NormAttrs& a) {
  return fp8kit_norm_config{static_cast<fp8kit_norm_type>(a.type), a.epsilon};
}

bool IsLayerNorm(const NormAttrs& a) { return a.type == FP8KIT_LAYERNORM; }

// The forward's tensors: x, gamma, beta (LayerNorm) and the FP8 output,
// mean (LayerNorm), rsigma and y when asked for. The cast is the target's.
struct Forward {
  fp8kit_tensor x, gamma, beta, out, mean, rsigma;
  std::optional<fp8kit_tensor> y;
  int64_t rows, hidden;
};

ffi::ErrorOr<Forward> DescribeForward(const char* op, const Device& device, ffi::AnyBuffer x,
                                      ffi::AnyBuffer gamma, ffi::AnyBuffer beta,
                                      ffi::AnyBuffer data, ffi::AnyBuffer columnwise,
                                      ffi::AnyBuffer mean, ffi::AnyBuffer rsigma,
                                      const HighPrecisionResult& y, const NormAttrs& a) {
  Forward f{};
  auto in = Describe(op, "x", x, device);
  if (in.has_error()) return ffi::Unexpected(in.error());
  f.x = *in;
  View2d(x.dimensions(), &f.rows, &f.hidden);
  for (auto [arg, buffer, dst, used] :
       {std::tuple<const char*, ffi::AnyBuffer*, fp8kit_tensor*, bool>{"gamma", &gamma, &f.gamma,
                                                                        true},
        {"beta", &beta, &f.beta, IsLayerNorm(a)},
        {"mean", &mean, &f.mean, IsLayerNorm(a)},
        {"rsigma", &rsigma, &f.rsigma, true}}) {
    if (!used) continue;
    auto t = Describe(op, arg, *buffer, device);
    if (t.has_error()) return ffi::Unexpected(t.error());
    *dst = *t;
  }
  auto out = DescribeFp8Output(op, f.x, data, columnwise, a.rowwise, a.columnwise);
  if (out.has_error()) return ffi::Unexpected(out.error());
  f.out = *out;
  auto hp = DescribeHighPrecision(op, "y", y, device);
  if (hp.has_error()) return ffi::Unexpected(hp.error());
  f.y = *hp;
  return f;
}

ffi::Error RunForward(Forward& f, const fp8kit_fused_cast& cast, const NormAttrs& a,
                      const Device& device) {
  const fp8kit_norm_config config = Config(a);
  const bool ln = IsLayerNorm(a);
  return FromStatus(fp8kit_norm_forward(&config, &f.x, &f.gamma, ln ? &f.beta : nullptr,
                                        Pointer(f.y), &f.out, &cast, ln ? &f.mean : nullptr,
                                        &f.rsigma, device.stream));
}

// Both delayed targets: `results` null for the read-only one.
ffi::Error ForwardDelayed(const char* op, const Device& device, const DelayedState& state,
                          const StateResults* results, ffi::AnyBuffer x, ffi::AnyBuffer gamma,
                          ffi::AnyBuffer beta, ffi::AnyBuffer workspace, ffi::AnyBuffer data,
                          ffi::AnyBuffer columnwise, F32Buffer* scale_inv, ffi::AnyBuffer mean,
                          ffi::AnyBuffer rsigma, const HighPrecisionResult& y,
                          const DelayedAttrs& d, const NormAttrs& a) {
  auto f = DescribeForward(op, device, x, gamma, beta, data, columnwise, mean, rsigma, y, a);
  if (f.has_error()) return f.error();
  if (auto err = SetScaleInv(op, &f->out, scale_inv); err.failure()) return err;
  CastWorkspace scratch(f->rows, f->hidden, false, FP8KIT_FUSED_CAST_DELAYED);
  if (auto err = scratch.Bind(op, device, workspace); err.failure()) return err;
  auto cast = scratch.Delayed(op, device, state, results, d);
  if (cast.has_error()) return cast.error();
  return RunForward(*f, *cast, a, device);
}

ffi::Error ForwardDelayedUpdateImpl(
    const Device& device, F32Buffer history, F32Buffer scale, F32Buffer seeded, F32Buffer amax,
    ffi::AnyBuffer x, ffi::AnyBuffer gamma, ffi::AnyBuffer beta, ffi::Result<F32Buffer> history_out,
    ffi::Result<F32Buffer> scale_out, ffi::Result<F32Buffer> seeded_out,
    ffi::Result<ffi::AnyBuffer> workspace, ffi::Result<ffi::AnyBuffer> data,
    ffi::Result<ffi::AnyBuffer> columnwise, ffi::Result<F32Buffer> scale_inv,
    ffi::Result<ffi::AnyBuffer> mean, ffi::Result<ffi::AnyBuffer> rsigma, HighPrecisionResult y,
    int64_t slot, int32_t margin, int32_t amax_reduction, int32_t type, float epsilon,
    bool rowwise, bool want_columnwise) {
  const StateResults results{&*history_out, &*scale_out, &*seeded_out};
  return ForwardDelayed(kForwardUpdate, device, {history, scale, seeded, amax}, &results, x,
                        gamma, beta, *workspace, *data, *columnwise, &*scale_inv, *mean, *rsigma,
                        y, {slot, margin, amax_reduction},
                        {type, epsilon, rowwise, want_columnwise});
}

ffi::Error ForwardDelayedImpl(const Device& device, F32Buffer history, F32Buffer scale,
                              F32Buffer seeded, F32Buffer amax, ffi::AnyBuffer x,
                              ffi::AnyBuffer gamma, ffi::AnyBuffer beta,
                              ffi::Result<ffi::AnyBuffer> workspace,
                              ffi::Result<ffi::AnyBuffer> data,
                              ffi::Result<ffi::AnyBuffer> columnwise,
                              ffi::Result<F32Buffer> scale_inv, ffi::Result<ffi::AnyBuffer> mean,
                              ffi::Result<ffi::AnyBuffer> rsigma, HighPrecisionResult y,
                              int64_t slot, int32_t margin, int32_t amax_reduction, int32_t type,
                              float epsilon, bool rowwise, bool want_columnwise) {
  return ForwardDelayed(kForwardRead, device, {history, scale, seeded, amax}, nullptr, x, gamma,
                        beta, *workspace, *data, *columnwise, &*scale_inv, *mean, *rsigma, y,
                        {slot, margin, amax_reduction},
                        {type, epsilon, rowwise, want_columnwise});
}

ffi::Error ForwardCurrentImpl(const Device& device, ffi::AnyBuffer x, ffi::AnyBuffer gamma,
                              ffi::AnyBuffer beta, ffi::Result<ffi::AnyBuffer> data,
                              ffi::Result<ffi::AnyBuffer> columnwise,
                              ffi::Result<F32Buffer> scale, ffi::Result<F32Buffer> scale_inv,
                              ffi::Result<F32Buffer> amax, ffi::Result<ffi::AnyBuffer> mean,
                              ffi::Result<ffi::AnyBuffer> rsigma, HighPrecisionResult y,
                              float amax_epsilon, bool power_2_scale, int32_t type, float epsilon,
                              bool rowwise, bool want_columnwise) {
  const NormAttrs a{type, epsilon, rowwise, want_columnwise};
  auto f = DescribeForward(kForwardCurrent, device, x, gamma, beta, *data, *columnwise, *mean,
                           *rsigma, y, a);
  if (f.has_error()) return f.error();
  auto cast = CurrentCast(kForwardCurrent, &f->out, &*scale, &*scale_inv, &*amax, amax_epsilon,
                          power_2_scale);
  if (cast.has_error()) return cast.error();
  return RunForward(*f, *cast, a, device);
}

template <typename Binding>
auto BindForwardInputs(Binding&& binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()   // x: [..., hidden] float32/bfloat16/float16
      .template Arg<ffi::AnyBuffer>()   // gamma: [hidden], x's dtype
      .template Arg<ffi::AnyBuffer>();  // beta: [hidden], x's dtype (LayerNorm) or (0,)
}

template <typename Binding>
auto BindForwardOutputs(Binding&& binding) {
  return std::move(binding)
      .template Ret<ffi::AnyBuffer>()   // data: FP8, x's shape (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>();  // columnwise: FP8 [hidden, rows] (or (0,))
}

// The last results: the statistics, then the optional y.
template <typename Binding>
auto BindStats(Binding&& binding) {
  return BindHighPrecision(  // y: x's dtype and shape, the value cast; or absent
      std::move(binding)
          .template Ret<ffi::AnyBuffer>()    // mean: float32 [rows] (LayerNorm) or (0,)
          .template Ret<ffi::AnyBuffer>());  // rsigma: float32 [rows]
}

template <typename Binding>
auto BindNormAttrs(Binding&& binding) {
  return std::move(binding)
      .template Attr<int32_t>("norm_type")  // norm_type: fp8kit_norm_type code
      .template Attr<float>("epsilon")      // epsilon: added to the variance
      .template Attr<bool>("rowwise")       // rowwise: write `data`
      .template Attr<bool>("columnwise");   // columnwise: write `columnwise`
}

// Recording: the state results alias the state inputs.
template <typename Binding>
auto BindForwardDelayedUpdate(Binding binding) {
  auto state = BindStateResults(BindForwardInputs(BindDelayedStateArgs(std::move(binding))));
  return BindNormAttrs(BindDelayedAttrs(
      BindStats(BindForwardOutputs(std::move(state).template Ret<ffi::AnyBuffer>())  // workspace
                    .template Ret<F32Buffer>())));  // scale_inv: 1 / the scale used
}

// Reading: no state results.
template <typename Binding>
auto BindForwardDelayed(Binding binding) {
  auto inputs = BindForwardInputs(BindDelayedStateArgs(std::move(binding)));
  return BindNormAttrs(BindDelayedAttrs(
      BindStats(BindForwardOutputs(std::move(inputs).template Ret<ffi::AnyBuffer>())  // workspace
                    .template Ret<F32Buffer>())));  // scale_inv: 1 / the scale used
}

template <typename Binding>
auto BindForwardCurrent(Binding binding) {
  return BindNormAttrs(BindCurrentAttrs(
      BindStats(BindForwardOutputs(BindForwardInputs(std::move(binding)))
                    .template Ret<F32Buffer>()    // scale: fp8_max / max(amax, epsilon)
                    .template Ret<F32Buffer>()    // scale_inv: 1 / scale
                    .template Ret<F32Buffer>())));  // amax: max |y|
}

// --- backward ----------------------------------------------------------------------------

ffi::Error BackwardImpl(const Device& device, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                        ffi::AnyBuffer mean, ffi::AnyBuffer rsigma, ffi::AnyBuffer gamma,
                        ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dgamma,
                        ffi::Result<ffi::AnyBuffer> dbeta, ffi::Result<F32Buffer> workspace,
                        int32_t type, float epsilon) {
  const char* op = kBackward;
  const bool ln = type == FP8KIT_LAYERNORM;
  fp8kit_tensor t[8] = {};
  const UsedBuffer buffers[8] = {
      {"dy", &dy, true},          {"x", &x, true},          {"mean", &mean, ln},
      {"rsigma", &rsigma, true},  {"gamma", &gamma, true},  {"dx", &*dx, true},
      {"dgamma", &*dgamma, true}, {"dbeta", &*dbeta, ln}};
  if (auto err = DescribeAll(op, device, buffers, t); err.failure()) return err;
  int64_t rows = 0, hidden = 0;
  View2d(x.dimensions(), &rows, &hidden);
  const int64_t floats = fp8kit_norm_backward_workspace(rows, hidden);
  if (workspace->element_count() < static_cast<size_t>(floats)) {
    return Invalid(op, "the workspace result has " + std::to_string(workspace->element_count()) +
                           " floats; this call needs " + std::to_string(floats) +
                           " (fp8kit_norm_backward_workspace)");
  }
  const fp8kit_norm_config config{static_cast<fp8kit_norm_type>(type), epsilon};
  return FromStatus(fp8kit_norm_backward(&config, &t[0], &t[1], ln ? &t[2] : nullptr, &t[3],
                                         &t[4], &t[5], &t[6], ln ? &t[7] : nullptr,
                                         floats > 0 ? workspace->typed_data() : nullptr,
                                         device.stream));
}

template <typename Binding>
auto BindBackward(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // dy: x's dtype and shape
      .template Arg<ffi::AnyBuffer>()  // x: [..., hidden] as in the forward
      .template Arg<ffi::AnyBuffer>()  // mean: float32 [rows] (LayerNorm) or (0,)
      .template Arg<ffi::AnyBuffer>()  // rsigma: float32 [rows]
      .template Arg<ffi::AnyBuffer>()  // gamma: [hidden], x's dtype
      .template Ret<ffi::AnyBuffer>()  // dx: x's dtype and shape
      .template Ret<ffi::AnyBuffer>()  // dgamma: [hidden] float32/bfloat16/float16
      .template Ret<ffi::AnyBuffer>()  // dbeta: like dgamma (LayerNorm) or (0,)
      .template Ret<F32Buffer>()       // workspace: fp8kit_norm_backward_workspace floats
      .template Attr<int32_t>("norm_type")  // norm_type: fp8kit_norm_type code
      .template Attr<float>("epsilon");     // epsilon: as in the forward (unused by the math)
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(norm_forward_delayed_update, fp8kit_jax::ForwardDelayedUpdateImpl,
                   fp8kit_jax::BindForwardDelayedUpdate);
FP8KIT_JAX_HANDLER(norm_forward_delayed, fp8kit_jax::ForwardDelayedImpl,
                   fp8kit_jax::BindForwardDelayed);
FP8KIT_JAX_HANDLER(norm_forward_current, fp8kit_jax::ForwardCurrentImpl,
                   fp8kit_jax::BindForwardCurrent);
FP8KIT_JAX_HANDLER(norm_backward, fp8kit_jax::BackwardImpl, fp8kit_jax::BindBackward);
