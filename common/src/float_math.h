// fp8kit's own float32 exp and sigmoid, host and device inline, so that the
// CPU reference and the CUDA kernels compute the same bits (libm's and
// CUDA's expf differ from each other by an ulp here and there). Built only
// from operations IEEE 754 specifies exactly: fma, correctly rounded + - *
// / and sqrt, min/max, and exact scaling by powers of two.
//
// The activation kernels are bound by these instructions, so the functions
// are branch-free: out-of-range arguments are clamped to where the result
// is already saturated (0 or 1) instead of returning early, and one
// scaling path covers normal, denormal and zero results. Largest errors
// against the exact value, over every float32 argument
// (tests/cpp/float_math_test.cc checks a sparser sweep): exp_nonpositive_f32
// 0.98 ulp, sigmoid and its complement 2.41 ulp.
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

// IEEE maxNum / minNum: the larger / smaller operand, the other one when
// one is NaN (one instruction on the GPU).
FP8KIT_HD float max_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return std::fmax(a, b);
#endif
}

FP8KIT_HD float min_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return std::fmin(a, b);
#endif
}

// x clamped to [lo, hi] (lo <= hi, neither NaN); a NaN x gives lo, so
// callers that must keep a NaN get it back through another operand.
FP8KIT_HD float clamp_f32(float x, float lo, float hi) { return min_f32(max_f32(x, lo), hi); }

// -|x| (NaN stays NaN; on the GPU an operand modifier, no instruction).
FP8KIT_HD float negative_abs(float x) {
#if defined(__CUDA_ARCH__)
  return -fabsf(x);
#else
  return -std::fabs(x);
#endif
}

// Round-to-integer constant: float32 values in [2^23, 2^24) are the
// integers, so t = y + 1.5 * 2^23 rounds y to an integer (ties to even)
// and keeps it in t's low mantissa bits while |y| < 2^22.
constexpr float kRoundToIntShift = 0x1.8p23f;

// 2^(b - 75) for 0 <= b <= 202, as float bits.
FP8KIT_HD float exp2_biased75(uint32_t b) { return bits_to_float((b + 52u) << 23); }

// e^y for y <= 0 (or NaN: NaN); +-0 give 1. Cody-Waite reduction
// y = k ln2 + r (k read off the bits of a round-to-integer sum, |r| <=
// ln2/2, two fma steps), e^r by a degree-6 polynomial (1 + r + r^2 q(r),
// q a Chebyshev fit: under 0.14 ulp), then the scaling by 2^k in two exact
// halves so that a denormal result is rounded once. Below -104, e^y rounds
// to 0 (under half the smallest denormal): the argument is clamped there,
// by a comparison so that a NaN passes through.
FP8KIT_HD float exp_nonpositive_f32(float y) {
  const float yc = y < -104.0f ? -104.0f : y;
  const float t = fma_rn(yc, 0x1.715476p+0f, kRoundToIntShift);  // y / ln2 + shift
  const float k = sub_rn(t, kRoundToIntShift);                    // in [-150, 0]
  float r = fma_rn(k, -0x1.62e4p-1f, yc);                         // ln2, high part: exact
  r = fma_rn(k, -0x1.7f7d1cp-20f, r);                             // ln2, low part
  float p = 0x1.6d110ap-10f;
  p = fma_rn(p, r, 0x1.120b6ep-7f);
  p = fma_rn(p, r, 0x1.55551ap-5f);
  p = fma_rn(p, r, 0x1.5554dcp-3f);
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);  // e^r in [0.7, 1.42]
  // k + 150 in [0, 150] from t's low bits, split into halves b1 + b2 (each
  // <= 75): p * 2^(b1 - 75) >= 0.7 * 2^-75 is normal (exact), and the
  // second multiply rounds once, also to a denormal or to 0.
  const uint32_t kb = float_to_bits(t) - float_to_bits(kRoundToIntShift) + 150u;
  const uint32_t b1 = kb >> 1;
  return mul_rn(mul_rn(p, exp2_biased75(b1)), exp2_biased75(kb - b1));
}

// sigmoid(x) = 1 / (1 + e^-x) and its complement 1 - sigmoid(x) =
// sigmoid(-x), each without cancellation: with e = e^-|x|, the smaller of
// the two is e / (1 + e) (correctly rounded), the larger 1 minus that
// (within an ulp: the smaller is at most 0.5). x >= 0 (-0 included) takes
// the larger as sigmoid; a NaN x gives NaN in both.
struct Sigmoid {
  float s;           // sigmoid(x)
  float complement;  // 1 - sigmoid(x)
};

FP8KIT_HD Sigmoid sigmoid_pair_f32(float x) {
  const float e = exp_nonpositive_f32(negative_abs(x));
  const float smaller = div_rn(e, add_rn(1.0f, e));
  const float larger = sub_rn(1.0f, smaller);
  const bool nonnegative = x >= 0.0f;
  return {nonnegative ? larger : smaller, nonnegative ? smaller : larger};
}

FP8KIT_HD float sigmoid_f32(float x) { return sigmoid_pair_f32(x).s; }

#if defined(__CUDA_ARCH__)
// The CUDA kernels' sigmoid pair: the same selection of the smaller and
// the larger value as sigmoid_pair_f32, from the special function unit's
// 2^t and reciprocal (ex2.approx.ftz, rcp.approx.ftz): 5 instructions where
// the exact pair takes about 30, which bound the activation kernels.
// Against sigmoid_pair_f32: e = e^-|x| is off by the MUFU's 2 ulp plus
// |x| log2(e) ulp of t's rounding (CUDA's own bound for __expf), and is 0
// below 2^-126 (|x| > 87.3, where the exact e is a denormal); then
// smaller = e / (1 + e) adds 2 ulp. So `smaller` is within (4 + 1.5 |x|)
// ulp or 2^-126 of the exact pair's, and `larger` within 1 ulp of 1
// minus that. fp8kit/activation.h states what this means for the outputs.
__device__ __forceinline__ Sigmoid sigmoid_pair_fast(float x) {
  constexpr float kLog2E = 0x1.715476p+0f;
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(negative_abs(x), kLog2E)));
  // e / (1 + e) as the reciprocal times e: what __fdividef computes, without
  // its guard for divisors beyond 2^+-126 (a compare and two scalings each
  // call), as 1 + e lies in [1, 2].
  float reciprocal;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(reciprocal) : "f"(__fadd_rn(1.0f, e)));
  const float smaller = __fmul_rn(e, reciprocal);
  const float larger = sub_rn(1.0f, smaller);
  const bool nonnegative = x >= 0.0f;
  return {nonnegative ? larger : smaller, nonnegative ? smaller : larger};
}
#endif

}  // namespace fp8kit

#endif  // FP8KIT_SRC_FLOAT_MATH_H_
