// Scale arithmetic shared (host and device inline) by the CPU reference and
// the CUDA kernels, so both compute bit-identical scales: current scaling
// (scale from this tensor's amax) and delayed scaling (scale from an amax
// history). Every operation is a single IEEE float32 operation with
// round-to-nearest-even; no fused or approximate math.
#ifndef FP8KIT_SRC_COMPUTE_SCALE_H_
#define FP8KIT_SRC_COMPUTE_SCALE_H_

#include <cstdint>

#include "float_bits.h"

namespace fp8kit {

// Largest finite float32 (FLT_MAX) and smallest normal float32 (FLT_MIN).
constexpr uint32_t kFloatMaxBits = 0x7f7fffffu;
constexpr uint32_t kFloatMinNormalBits = 0x00800000u;

FP8KIT_HD bool is_finite_float(float x) {
  return (float_to_bits(x) & 0x7f800000u) != 0x7f800000u;
}

FP8KIT_HD bool is_nan_float(float x) { return (float_to_bits(x) & 0x7fffffffu) > 0x7f800000u; }

FP8KIT_HD bool is_inf_float(float x) { return (float_to_bits(x) & 0x7fffffffu) == 0x7f800000u; }

// a / b, correctly rounded, on host and device alike.
FP8KIT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// a * b, correctly rounded, never contracted into an FMA.
FP8KIT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The canonical quiet NaN (0x7FC00000) the CPU and CUDA paths both write
// for a NaN scale or scale_inv, so that they agree bit for bit (a GPU's
// division returns 0x7FFFFFFF for a NaN operand, the CPU's the operand).
constexpr uint32_t kCanonicalNanBits = 0x7fc00000u;

FP8KIT_HD float canonical_nan() { return bits_to_float(kCanonicalNanBits); }

// scale_inv = 1 / scale; a NaN scale gives the canonical NaN.
FP8KIT_HD float reciprocal(float scale) {
  return is_nan_float(scale) ? canonical_nan() : div_rn(1.0f, scale);
}

// The scale a quantization with a given scale casts with (the policy of
// fp8kit/quantize.h): the scale itself when it is finite and > 0 (a
// positive denormal included), else (0, negative, +-inf, NaN) the
// canonical NaN, so that every element casts to the FP8 NaN code and
// scale_inv = 1/scale is NaN: a bad scale never gives a plausible result.
// One compare per read of the scale; no device sync.
FP8KIT_HD float checked_scale(float scale) {
  return is_finite_float(scale) && scale > 0.0f ? scale : canonical_nan();
}

// Keeps a computed scale usable: one that overflowed float32 (amax tiny
// next to fp8_max) becomes FLT_MAX, one that underflowed to zero or a
// denormal becomes FLT_MIN, so that scale_inv = 1/scale stays finite and
// non-zero.
FP8KIT_HD float clamp_scale(float scale) {
  const uint32_t bits = float_to_bits(scale);
  if (bits >= 0x7f800000u) return bits_to_float(kFloatMaxBits);  // +inf (NaN cannot occur)
  if (bits < kFloatMinNormalBits) return bits_to_float(kFloatMinNormalBits);
  return scale;
}

// The smallest scale a computed scale may have: fp8_max * (1 / scale), the
// largest dequantized value, is then at most FLT_MAX (so a finite input
// never dequantizes to inf), and so it is for every larger scale, rounding
// being monotone. fp8_max / FLT_MAX: 1.75 * 2^-120 (E4M3), 1.75 * 2^-113
// (E5M2), both rounded up by one ulp.
FP8KIT_HD float min_computed_scale(float fp8_max) {
  return div_rn(fp8_max, bits_to_float(kFloatMaxBits));
}

// Current scaling: the scale for a tensor whose max |x| is `amax`.
//   - amax zero, NaN or inf (the tensor is all zeros or holds a non-finite
//     value), or negative (not a valid amax): 1;
//   - otherwise fp8_max / max(amax, epsilon), clamped as above; this is at
//     least min_computed_scale, the divisor being at most FLT_MAX;
//   - power_2_scale: then rounded down to a power of two (the float32
//     mantissa cleared), so that scale_inv is exact, but to the power of
//     two above when that would fall below min_computed_scale (amax above
//     1.75 * 2^127, where 2^-120 would dequantize E4M3 256 to 2^128 = inf).
FP8KIT_HD float current_scale_from_amax(float amax, float fp8_max, float epsilon,
                                        bool power_2_scale) {
  if (!is_finite_float(amax) || !(amax > 0.0f)) return 1.0f;
  const float denom = amax < epsilon ? epsilon : amax;
  float scale = clamp_scale(div_rn(fp8_max, denom));
  if (power_2_scale) {
    scale = bits_to_float(float_to_bits(scale) & 0xff800000u);
    if (scale < min_computed_scale(fp8_max)) scale = mul_rn(scale, 2.0f);
  }
  return scale;
}

// 2**e as a float for |e| <= 126 (exact).
FP8KIT_HD float exp2_int(int e) { return bits_to_float(uint32_t(127 + e) << 23); }

// Delayed scaling: the new scale from the reduced amax history.
//   - amax_reduced finite and > 0: fp8_max / amax_reduced / 2**margin
//     (the division by 2**margin done as an exact multiplication by
//     2**-margin, 0 <= margin <= FP8KIT_MARGIN_MAX), clamped as above, and
//     at least min_computed_scale: with amax_reduced near FLT_MAX the margin
//     would otherwise let fp8_max dequantize to inf;
//   - otherwise (zero, negative, NaN, inf): the previous scale, unchanged.
FP8KIT_HD float delayed_scale_from_amax(float amax_reduced, float previous_scale, float fp8_max,
                                        int margin) {
  if (!is_finite_float(amax_reduced) || !(amax_reduced > 0.0f)) return previous_scale;
  const float scale = clamp_scale(mul_rn(div_rn(fp8_max, amax_reduced), exp2_int(-margin)));
  const float floor = min_computed_scale(fp8_max);
  return scale < floor ? floor : scale;
}

// NaN-propagating max of two amax values: NaN if either is NaN. Max is
// associative and commutative here, so any reduction order gives the same
// NaN-ness and, for non-NaN inputs, the same value.
FP8KIT_HD float max_nan(float a, float b) {
  if (is_nan_float(a)) return a;
  if (is_nan_float(b)) return b;
  return a > b ? a : b;
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_COMPUTE_SCALE_H_
