// GELU (tanh approximation) and SwiGLU with their derivatives, host and
// device inline: the exact order of operations fp8kit/activation.h
// documents, shared by the CPU reference and the CUDA kernels.
#ifndef FP8KIT_SRC_ACTIVATION_MATH_H_
#define FP8KIT_SRC_ACTIVATION_MATH_H_

#include "column_sums.h"
#include "compute_scale.h"
#include "float_bits.h"
#include "float_math.h"

namespace fp8kit {

constexpr float kGeluK0 = 0x1.988454p-1f;   // sqrt(2 / pi)
constexpr float kGeluK1 = 0x1.6e4e26p-5f;   // 0.044715
constexpr float kGeluK1x3 = 0x1.12ba9ep-3f; // 3 * 0.044715

// gelu(x) = 0.5 x (1 + tanh(k0 (x + k1 x^3))); -0 where 1 + tanh is 0
// (x very negative or -inf), so -inf does not give -inf * 0.
FP8KIT_HD float gelu_f32(float x) {
  const float x3 = mul_rn(mul_rn(x, x), x);
  const float t = tanh_f32(mul_rn(kGeluK0, fma_rn(kGeluK1, x3, x)));
  const float one_plus_t = add_rn(1.0f, t);
  if (one_plus_t == 0.0f) return with_sign_of(0.0f, x);
  return mul_rn(mul_rn(0.5f, x), one_plus_t);
}

// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2); the second
// term is dropped where 1 - t^2 is 0 (|x| large or inf, where it would be
// 0 * inf).
FP8KIT_HD float gelu_grad_f32(float x) {
  const float x2 = mul_rn(x, x);
  const float t = tanh_f32(mul_rn(kGeluK0, fma_rn(kGeluK1, mul_rn(x2, x), x)));
  const float left = mul_rn(0.5f, add_rn(1.0f, t));
  const float dt = fma_rn(-t, t, 1.0f);
  if (dt == 0.0f) return left;
  const float dinner = mul_rn(kGeluK0, fma_rn(kGeluK1x3, x2, 1.0f));
  return fma_rn(mul_rn(mul_rn(0.5f, x), dt), dinner, left);
}

// silu(g) = g * sigmoid(g); -0 for g = -inf (its limit).
FP8KIT_HD float silu_f32(float g) {
  if (g < 0.0f && !is_finite_float(g)) return -0.0f;
  return mul_rn(g, sigmoid_f32(g));
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g); its limits 1 and 0 at
// +-inf.
FP8KIT_HD float silu_grad_f32(float g) {
  if (!is_finite_float(g) && !is_nan_float(g)) return g > 0.0f ? 1.0f : 0.0f;
  const float s = sigmoid_f32(g);
  return mul_rn(s, fma_rn(g, sub_rn(1.0f, s), 1.0f));
}

// SwiGLU forward: a = silu(gate) * up.
FP8KIT_HD float swiglu_f32(float gate, float up) { return mul_rn(silu_f32(gate), up); }

// SwiGLU backward: d_gate = (d_a * up) * silu'(gate), d_up = d_a * silu(gate).
FP8KIT_HD float swiglu_grad_gate_f32(float d_a, float gate, float up) {
  return mul_rn(mul_rn(d_a, up), silu_grad_f32(gate));
}
FP8KIT_HD float swiglu_grad_up_f32(float d_a, float gate) { return mul_rn(d_a, silu_f32(gate)); }

// GELU backward: dh = d_a * gelu'(h).
FP8KIT_HD float gelu_backward_f32(float d_a, float h) { return mul_rn(d_a, gelu_grad_f32(h)); }

}  // namespace fp8kit

#endif  // FP8KIT_SRC_ACTIVATION_MATH_H_
