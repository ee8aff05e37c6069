// float32 <-> FP8 (E4M3 = float8_e4m3fn, E5M2 = float8_e5m2) by bit
// manipulation, host and device inline, so the CPU reference and the CUDA
// kernels round identically.
//
// Encoding rules (the contract of fp8kit/quantize.h):
//   - round to nearest, ties to even, directly from float32 (no double
//     rounding);
//   - finite values beyond the largest finite FP8 value saturate to +-max
//     (E4M3 0x7E/0xFE = +-448, E5M2 0x7B/0xFB = +-57344);
//   - +-inf is not saturated, so that an overflow upstream reaches the GEMM
//     output as it would in bf16: E4M3, which has no inf, gives NaN 0x7F;
//     E5M2 keeps +-inf (0x7C/0xFC);
//   - NaN (either sign) becomes the canonical 0x7F, which is NaN in both
//     formats and is what the Hopper cvt.rn.satfinite instructions produce;
//   - results that round to zero keep the sign (-tiny -> 0x80), float32
//     denormal inputs included.
// Quantizing an input element x casts x * scale (one float32 multiply): a
// finite x whose product overflows float32 is a finite value beyond max and
// saturates; only an infinite x gives the non-finite code.
// For finite x this equals ml_dtypes' conversion of clip(x, -max, max),
// for +-inf ml_dtypes' own conversion, except for the NaN code, always
// 0x7F here (ml_dtypes keeps the sign, and writes 0x7E in E5M2);
// tests/cpp/quantize_test.cc checks it against an independent
// nearest-value search.
//
// The CUDA kernels convert with the hardware cvt.rn.satfinite, which
// saturates inf too: float_to_fp8_satfinite is that conversion (checked
// against it over all 2^32 float32 patterns, tests/cpp/fp8_cvt_selftest.cu),
// and fp8_code_of_inf the code that both sides then give an infinite input.
#ifndef FP8KIT_SRC_FP8_CONVERT_H_
#define FP8KIT_SRC_FP8_CONVERT_H_

#include <cstdint>

#include "compute_scale.h"
#include "float_bits.h"
#include "fp8kit/tensor.h"

namespace fp8kit {
namespace fp8_detail {

// Right shift of a non-negative integer by `shift` (1..31) with
// round-to-nearest-even on the bits shifted out.
FP8KIT_HD uint32_t shift_right_rne(uint32_t v, int shift) {
  const uint32_t q = v >> shift;
  const uint32_t rem = v & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// One satfinite converter for both formats (+-inf saturates to +-max).
// kMantBits: stored mantissa bits; kBias: exponent bias; kMaxBits: encoding
// of the largest finite value (sign off).
template <int kMantBits, int kBias, uint32_t kMaxBits>
FP8KIT_HD uint8_t float_to_fp8_satfinite(float x) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;  // NaN, canonical
  // Largest finite FP8 value as float32 bits: exponent (kMaxBits >> kMantBits)
  // rebiased, mantissa bits shifted into place.
  constexpr uint32_t kMaxFloatBits =
      ((((kMaxBits >> kMantBits) + 127u - kBias) << 23) |
       ((kMaxBits & ((1u << kMantBits) - 1u)) << (23 - kMantBits)));
  if (abs >= kMaxFloatBits) return uint8_t(sign | kMaxBits);  // saturate, inf included
  // Smallest normal FP8 exponent 1 - kBias, as a float32 exponent field.
  constexpr uint32_t kMinNormalExp = 127u + 1u - kBias;
  const uint32_t exp = abs >> 23;
  if (exp >= kMinNormalExp) {
    // Normal result: rebias the exponent and round the mantissa; a carry out
    // of the mantissa correctly bumps the exponent (it cannot pass max, since
    // abs < max here and max is representable).
    const uint32_t rebiased = abs - ((127u - kBias) << 23);
    return uint8_t(sign | shift_right_rne(rebiased, 23 - kMantBits));
  }
  // Denormal (or zero) result: the FP8 value is an integer count of the
  // smallest step 2^(1 - kBias - kMantBits). |x| = m * 2^(exp - 150) with m
  // the 24-bit significand, so the count is m * 2^(exp - 150 + kBias - 1 +
  // kMantBits) = m >> shift. The count may round up to 1 << kMantBits, which
  // is exactly the encoding of the smallest normal.
  const int shift = 150 - int(kBias) + 1 - kMantBits - int(exp);
  if (shift >= 25) return uint8_t(sign);  // < half the smallest step: +-0
  const uint32_t m = (exp == 0) ? abs : ((abs & 0x7fffffu) | 0x800000u);
  return uint8_t(sign | shift_right_rne(m, shift));
}

template <int kMantBits, int kBias>
FP8KIT_HD float fp8_bits_to_float(uint8_t b, bool has_inf) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  constexpr int kExpBits = 7 - kMantBits;
  constexpr uint32_t kExpMax = (1u << kExpBits) - 1u;
  const uint32_t e = (b >> kMantBits) & kExpMax;
  const uint32_t m = b & ((1u << kMantBits) - 1u);
  if (e == kExpMax) {
    if (has_inf) return bits_to_float(sign | (m == 0 ? 0x7f800000u : 0x7fc00000u));
    if (m == (1u << kMantBits) - 1u) return bits_to_float(sign | 0x7fc00000u);  // E4M3 NaN
  }
  if (e == 0) {
    // Denormal: m * 2^(1 - kBias - kMantBits), exact in float32.
    constexpr uint32_t kStepBits = uint32_t(127 + 1 - kBias - kMantBits) << 23;
    const float mag = float(m) * bits_to_float(kStepBits);
    return bits_to_float(sign | float_to_bits(mag));
  }
  return bits_to_float(sign | ((e + 127u - kBias) << 23) | (m << (23 - kMantBits)));
}

}  // namespace fp8_detail

// The satfinite conversions, as cvt.rn.satfinite: +-inf -> +-max.
// E4M3 (float8_e4m3fn): bias 7, 3 mantissa bits, max 448 = 0x7E, NaN 0x7F.
FP8KIT_HD uint8_t float_to_e4m3_satfinite(float x) {
  return fp8_detail::float_to_fp8_satfinite<3, 7, 0x7eu>(x);
}
// E5M2 (float8_e5m2): bias 15, 2 mantissa bits, max 57344 = 0x7B, inf 0x7C.
FP8KIT_HD uint8_t float_to_e5m2_satfinite(float x) {
  return fp8_detail::float_to_fp8_satfinite<2, 15, 0x7bu>(x);
}

// The code of an infinite input element, from y = x * scale: +-inf, or NaN
// when the scale is NaN (a bad scale, fp8kit/quantize.h), which must give
// NaN in E5M2 too.
template <bool kE4M3>
FP8KIT_HD uint8_t fp8_code_of_inf(float y) {
  if (kE4M3 || is_nan_float(y)) return 0x7f;
  return uint8_t(((float_to_bits(y) >> 24) & 0x80u) | 0x7cu);
}

// q of an input element x: the code of x * scale, where a finite x
// saturates even when its product overflows float32.
template <bool kE4M3>
FP8KIT_HD uint8_t quantize_to_fp8(float x, float scale) {
  const float y = mul_rn(x, scale);
  if (is_inf_float(x)) return fp8_code_of_inf<kE4M3>(y);
  return kE4M3 ? float_to_e4m3_satfinite(y) : float_to_e5m2_satfinite(y);
}

// The cast of one float32 value: quantization with scale 1.
FP8KIT_HD uint8_t float_to_e4m3_bits(float x) { return quantize_to_fp8<true>(x, 1.0f); }
FP8KIT_HD uint8_t float_to_e5m2_bits(float x) { return quantize_to_fp8<false>(x, 1.0f); }

// Exact decoding (every FP8 value is a float32 value). E4M3 0x7F/0xFF are
// NaN; E5M2 exponent 31 is inf (mantissa 0) or NaN.
FP8KIT_HD float e4m3_bits_to_float(uint8_t b) { return fp8_detail::fp8_bits_to_float<3, 7>(b, false); }
FP8KIT_HD float e5m2_bits_to_float(uint8_t b) { return fp8_detail::fp8_bits_to_float<2, 15>(b, true); }

// By dtype; `dtype` must be FP8KIT_E4M3 or FP8KIT_E5M2 (anything else is
// treated as E5M2: callers validate first).
FP8KIT_HD uint8_t quantize_to_fp8(float x, float scale, fp8kit_dtype dtype) {
  return dtype == FP8KIT_E4M3 ? quantize_to_fp8<true>(x, scale) : quantize_to_fp8<false>(x, scale);
}
FP8KIT_HD uint8_t float_to_fp8_bits(float x, fp8kit_dtype dtype) {
  return quantize_to_fp8(x, 1.0f, dtype);
}
FP8KIT_HD float fp8_bits_to_float(uint8_t b, fp8kit_dtype dtype) {
  return dtype == FP8KIT_E4M3 ? e4m3_bits_to_float(b) : e5m2_bits_to_float(b);
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_FP8_CONVERT_H_
