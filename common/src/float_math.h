// fp8kit's own float32 exp, expm1, tanh and sigmoid, host and device
// inline, so that the CPU reference and the CUDA kernels compute the same
// bits (libm's and CUDA's expf/tanhf differ from each other by an ulp here
// and there). Built only from operations IEEE 754 specifies exactly: fma,
// correctly rounded + - * / and sqrt, round-to-integer, and exact scaling
// by powers of two. Accurate to a few ulp (tests/cpp/float_math_test.cc
// measures them against float64 over a dense sweep of float32).
#ifndef FP8KIT_SRC_FLOAT_MATH_H_
#define FP8KIT_SRC_FLOAT_MATH_H_

#include <cmath>
#include <cstdint>

#include "column_sums.h"
#include "compute_scale.h"
#include "float_bits.h"

namespace fp8kit {

// a - b, correctly rounded.
FP8KIT_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// a * b + c with one rounding.
FP8KIT_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// sqrt(x), correctly rounded.
FP8KIT_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// x rounded to the nearest integer, ties to even (exact).
FP8KIT_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

FP8KIT_HD float with_sign_of(float magnitude, float sign_source) {
  return bits_to_float((float_to_bits(magnitude) & 0x7fffffffu) |
                       (float_to_bits(sign_source) & 0x80000000u));
}

// e^x. Cody-Waite reduction x = k ln2 + r (|r| <= ln2/2, two fma steps),
// e^r by its Taylor polynomial of degree 8 (truncation error below 0.05
// ulp), then the exact scaling by 2^k; a result in the denormal range is
// rounded once (the scaling is split so that the first step is exact).
FP8KIT_HD float exp_f32(float x) {
  if (is_nan_float(x)) return x;
  if (x > 88.8f) return bits_to_float(0x7f800000u);  // beyond ln(FLT_MAX)
  if (x < -104.0f) return 0.0f;                       // below half the smallest denormal
  const float k = round_even(mul_rn(x, 0x1.715476p+0f));  // x / ln2
  float r = fma_rn(k, -0x1.62e4p-1f, x);                // ln2, high part
  r = fma_rn(k, -0x1.7f7d1cp-20f, r);                   // ln2, low part
  float p = 0x1.a01a02p-16f;                            // 1/8!
  p = fma_rn(p, r, 0x1.a01a02p-13f);                    // 1/7!
  p = fma_rn(p, r, 0x1.6c16c2p-10f);                    // 1/6!
  p = fma_rn(p, r, 0x1.111112p-7f);                     // 1/5!
  p = fma_rn(p, r, 0x1.555556p-5f);                     // 1/4!
  p = fma_rn(p, r, 0x1.555556p-3f);                     // 1/3!
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  const float e = fma_rn(p, r, 1.0f);  // e^r in [0.7, 1.42]
  const int ki = int(k);
  if (ki > 127) return mul_rn(mul_rn(e, exp2_int(127)), exp2_int(ki - 127));  // may overflow to inf
  if (ki < -126) return mul_rn(mul_rn(e, exp2_int(ki + 64)), exp2_int(-64));
  return mul_rn(e, exp2_int(ki));
}

// e^y - 1 for 0 <= y: the Taylor polynomial of degree 11 below 1 (no
// cancellation; y itself for tiny y), exp_f32(y) - 1 from 1 on (e^y >= e,
// so the subtraction loses under one bit).
FP8KIT_HD float expm1_nonnegative(float y) {
  if (y >= 1.0f) return sub_rn(exp_f32(y), 1.0f);
  float p = 0x1.ae6456p-26f;           // 1/11!
  p = fma_rn(p, y, 0x1.27e4fcp-22f);   // 1/10!
  p = fma_rn(p, y, 0x1.71de3ap-19f);   // 1/9!
  p = fma_rn(p, y, 0x1.a01a02p-16f);   // 1/8!
  p = fma_rn(p, y, 0x1.a01a02p-13f);   // 1/7!
  p = fma_rn(p, y, 0x1.6c16c2p-10f);   // 1/6!
  p = fma_rn(p, y, 0x1.111112p-7f);    // 1/5!
  p = fma_rn(p, y, 0x1.555556p-5f);    // 1/4!
  p = fma_rn(p, y, 0x1.555556p-3f);    // 1/3!
  p = fma_rn(p, y, 0.5f);
  p = fma_rn(p, y, 1.0f);
  return mul_rn(p, y);
}

// tanh(x) = sign(x) * t / (t + 2) with t = e^(2|x|) - 1; +-1 from |x| >=
// 9.1 on (where tanh rounds to 1); keeps the sign of zero.
FP8KIT_HD float tanh_f32(float x) {
  if (is_nan_float(x)) return x;
  const float a = bits_to_float(float_to_bits(x) & 0x7fffffffu);
  if (a >= 9.1f) return with_sign_of(1.0f, x);
  const float t = expm1_nonnegative(add_rn(a, a));
  return with_sign_of(div_rn(t, add_rn(t, 2.0f)), x);
}

// 1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 so that e^... never
// overflows and small results keep their relative accuracy.
FP8KIT_HD float sigmoid_f32(float x) {
  if (x < 0.0f) {
    const float e = exp_f32(x);
    return div_rn(e, add_rn(1.0f, e));
  }
  return div_rn(1.0f, add_rn(1.0f, exp_f32(-x)));
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_FLOAT_MATH_H_
