// FFI handlers of the fused ops without their FP8 cast (the FP8 output and
// the cast NULL: fp8kit/normalization.h, activation.h), for the layers
// under block scaling, whose cast takes one scale per 1x128 tile and runs
// as its own block quantization:
//   fp8kit_norm_forward_values        x, gamma, beta -> y, mean, rsigma
//   fp8kit_activation_forward_values  h -> a
//   fp8kit_activation_backward_values d_a, h -> dh
// Outputs are in the input's dtype. Operands RMSNorm does not use (beta,
// mean) are (0,) placeholders, as in normalization_ffi.cc.
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kNorm[] = "fp8kit_norm_forward_values";
constexpr char kForward[] = "fp8kit_activation_forward_values";
constexpr char kBackward[] = "fp8kit_activation_backward_values";

ffi::Error NormImpl(const Device& device, ffi::AnyBuffer x, ffi::AnyBuffer gamma,
                    ffi::AnyBuffer beta, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::AnyBuffer> mean, ffi::Result<ffi::AnyBuffer> rsigma,
                    int32_t type, float epsilon) {
  const bool ln = type == FP8KIT_LAYERNORM;
  fp8kit_tensor t[6] = {};
  const UsedBuffer buffers[6] = {
      {"x", &x, true},   {"gamma", &gamma, true}, {"beta", &beta, ln},
      {"y", &*y, true},  {"mean", &*mean, ln},    {"rsigma", &*rsigma, true}};
  if (auto err = DescribeAll(kNorm, device, buffers, t); err.failure()) return err;
  const fp8kit_norm_config config{static_cast<fp8kit_norm_type>(type), epsilon};
  return FromStatus(fp8kit_norm_forward(&config, &t[0], &t[1], ln ? &t[2] : nullptr, &t[3],
                                        nullptr, nullptr, ln ? &t[4] : nullptr, &t[5],
                                        device.stream));
}

ffi::Error ForwardImpl(const Device& device, ffi::AnyBuffer h, ffi::Result<ffi::AnyBuffer> a,
                       int32_t activation) {
  fp8kit_tensor t[2] = {};
  const UsedBuffer buffers[2] = {{"h", &h, true}, {"a", &*a, true}};
  if (auto err = DescribeAll(kForward, device, buffers, t); err.failure()) return err;
  return FromStatus(fp8kit_activation_forward(static_cast<fp8kit_activation>(activation), &t[0],
                                              &t[1], nullptr, nullptr, device.stream));
}

ffi::Error BackwardImpl(const Device& device, ffi::AnyBuffer d_a, ffi::AnyBuffer h,
                        ffi::Result<ffi::AnyBuffer> dh, int32_t activation) {
  fp8kit_tensor t[3] = {};
  const UsedBuffer buffers[3] = {
      {"d_a", &d_a, true}, {"h", &h, true}, {"dh", &*dh, true}};
  if (auto err = DescribeAll(kBackward, device, buffers, t); err.failure()) return err;
  return FromStatus(fp8kit_activation_backward(static_cast<fp8kit_activation>(activation), &t[0],
                                               &t[1], &t[2], nullptr, nullptr, nullptr,
                                               device.stream));
}

template <typename Binding>
auto BindNorm(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // x: [..., hidden] float32/bfloat16/float16
      .template Arg<ffi::AnyBuffer>()  // gamma: [hidden], x's dtype
      .template Arg<ffi::AnyBuffer>()  // beta: [hidden], x's dtype (LayerNorm) or (0,)
      .template Ret<ffi::AnyBuffer>()  // y: x's dtype and shape
      .template Ret<ffi::AnyBuffer>()  // mean: float32 [rows] (LayerNorm) or (0,)
      .template Ret<ffi::AnyBuffer>()  // rsigma: float32 [rows]
      .template Attr<int32_t>("norm_type")  // norm_type: fp8kit_norm_type code
      .template Attr<float>("epsilon");     // epsilon: added to the variance
}

template <typename Binding>
auto BindForward(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // h: [..., F] or SwiGLU's [..., 2F]
      .template Ret<ffi::AnyBuffer>()          // a: [..., F], h's dtype
      .template Attr<int32_t>("activation");  // activation: fp8kit_activation code
}

template <typename Binding>
auto BindBackward(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // d_a: [..., F], h's dtype
      .template Arg<ffi::AnyBuffer>()          // h: as in the forward
      .template Ret<ffi::AnyBuffer>()          // dh: h's dtype and shape
      .template Attr<int32_t>("activation");  // activation: fp8kit_activation code
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(norm_forward_values, fp8kit_jax::NormImpl, fp8kit_jax::BindNorm);
FP8KIT_JAX_HANDLER(activation_forward_values, fp8kit_jax::ForwardImpl, fp8kit_jax::BindForward);
FP8KIT_JAX_HANDLER(activation_backward_values, fp8kit_jax::BackwardImpl,
                   fp8kit_jax::BindBackward);
