// GELU (tanh approximation) and SwiGLU with their derivatives, host and
// device inline: the order of operations fp8kit/activation.h documents,
// shared by the CPU reference and the CUDA kernels. Only the sigmoid
// differs: the CPU reference's is exact to 2.4 ulp (float_math.h), the
// kernels' comes from the special function unit (sigmoid_pair_fast), the
// bound fp8kit/activation.h states. Branch-free (the kernels are bound by
// these instructions): the limits at +-inf come from clamps and from
// sigmoid's exact 0 and 1, not from special cases.
#ifndef FP8KIT_SRC_ACTIVATION_MATH_H_
#define FP8KIT_SRC_ACTIVATION_MATH_H_

#include "column_sums.h"
#include "compute_scale.h"
#include "float_bits.h"
#include "float_math.h"

namespace fp8kit {

// The sigmoid pair of this side: exact on the host, fast on the GPU.
FP8KIT_HD Sigmoid activation_sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  return sigmoid_pair_fast(x);
#else
  return sigmoid_pair_f32(x);
#endif
}

// GELU's 0.5 (1 + tanh(u)) is sigmoid(2u): u = k0 (x + k1 x^3), and 2 k0
// is exact.
constexpr float kGelu2K0 = 0x1.988454p+0f;   // 2 sqrt(2 / pi)
constexpr float kGeluK1 = 0x1.6e4e26p-5f;    // 0.044715
constexpr float kGeluK1x3 = 0x1.12ba9ep-3f;  // 3 * 0.044715
constexpr float kFloatMax = 0x1.fffffep+127f;

// Beyond |x| = 16 GELU's sigmoid argument exceeds 300 in magnitude, where
// s (1 - s) is exactly 0: clamping x there leaves gelu' unchanged and keeps
// x * v'(x) finite.
constexpr float kGeluGradClamp = 16.0f;

// v = 2 k0 (x + k1 x^3), the sigmoid argument of GELU, from x and x^2.
FP8KIT_HD float gelu_sigmoid_arg(float x, float x2) {
  return mul_rn(kGelu2K0, fma_rn(kGeluK1, mul_rn(x2, x), x));
}

// gelu(x) = x * sigmoid(v); x = -inf gives -0 (its limit: x is clamped
// to -FLT_MAX, where sigmoid is exactly 0, so that it is not -inf * 0).
FP8KIT_HD float gelu_f32(float x) {
  const float s = activation_sigmoid(gelu_sigmoid_arg(x, mul_rn(x, x))).s;
  return mul_rn(max_f32(x, -kFloatMax), s);
}

// gelu'(x) = s + x s (1 - s) v'(x), s = sigmoid(v), v'(x) = 2 k0 (1 + 3 k1
// x^2); the second term on x clamped to +-16 (kGeluGradClamp), so the
// limits 1 and 0 at +-inf need no special case. A NaN x makes s NaN.
FP8KIT_HD float gelu_grad_f32(float x) {
  const Sigmoid sig = activation_sigmoid(gelu_sigmoid_arg(x, mul_rn(x, x)));
  const float xc = clamp_f32(x, -kGeluGradClamp, kGeluGradClamp);
  const float dv = mul_rn(kGelu2K0, fma_rn(kGeluK1x3, mul_rn(xc, xc), 1.0f));
  return fma_rn(mul_rn(xc, mul_rn(sig.s, sig.complement)), dv, sig.s);
}

// silu(g) = g * s, s = sigmoid(g); g = -inf gives -0 (clamped to
// -FLT_MAX, where s is exactly 0).
FP8KIT_HD float silu_from_sigmoid(float g, float s) {
  return mul_rn(max_f32(g, -kFloatMax), s);
}

// silu'(g) = s + g s (1 - s); g clamped to +-FLT_MAX (s (1 - s) is exactly
// 0 there), so the limits 1 and 0 at +-inf need no special case.
FP8KIT_HD float silu_grad_from_sigmoid(float g, const Sigmoid& sig) {
  return fma_rn(clamp_f32(g, -kFloatMax, kFloatMax), mul_rn(sig.s, sig.complement), sig.s);
}

FP8KIT_HD float silu_f32(float g) { return silu_from_sigmoid(g, activation_sigmoid(g).s); }

FP8KIT_HD float silu_grad_f32(float g) { return silu_grad_from_sigmoid(g, activation_sigmoid(g)); }

// SwiGLU forward: a = silu(gate) * up.
FP8KIT_HD float swiglu_f32(float gate, float up) { return mul_rn(silu_f32(gate), up); }

// SwiGLU backward of one (gate, up) pair, sharing one sigmoid:
// d_gate = (d_a * up) * silu'(gate), d_up = d_a * silu(gate).
struct SwigluGrad {
  float d_gate;
  float d_up;
};

FP8KIT_HD SwigluGrad swiglu_grad_f32(float d_a, float gate, float up) {
  const Sigmoid sig = activation_sigmoid(gate);
  return {mul_rn(mul_rn(d_a, up), silu_grad_from_sigmoid(gate, sig)),
          mul_rn(d_a, silu_from_sigmoid(gate, sig.s))};
}

// GELU backward: dh = d_a * gelu'(h).
FP8KIT_HD float gelu_backward_f32(float d_a, float h) { return mul_rn(d_a, gelu_grad_f32(h)); }

}  // namespace fp8kit

#endif  // FP8KIT_SRC_ACTIVATION_MATH_H_
