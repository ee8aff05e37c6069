// Dequantization arithmetic shared (host and device inline) by the CPU
// reference and the CUDA kernel: value = fp8 value * scale_inv in float32
// (one correctly rounded multiply), then rounded to the output dtype with
// round-to-nearest-even. Software rounding on both sides keeps them
// bit-identical (NaN included: canonical quiet NaNs).
#ifndef FP8KIT_SRC_DEQUANTIZE_CONVERT_H_
#define FP8KIT_SRC_DEQUANTIZE_CONVERT_H_

#include <cstdint>

#include "compute_scale.h"
#include "float_bits.h"
#include "fp8_convert.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// float32 -> bfloat16 bits, RNE; overflow rounds to inf as IEEE does; NaN
// -> 0x7FC0.
FP8KIT_HD uint16_t float_to_bf16_bits(float x) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7fc0;
  // bfloat16 has float32's exponent range: rounding the low 16 bits away
  // handles normals, denormals and overflow to inf alike.
  return uint16_t(((bits >> 16) & 0x8000u) | fp8_detail::shift_right_rne(abs, 16));
}

// float32 -> IEEE binary16 bits, RNE with denormals; |x| >= 65520 (the
// midpoint above 65504) becomes inf; NaN -> 0x7E00.
FP8KIT_HD uint16_t float_to_fp16_bits(float x) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7e00;
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // 65520 and above
  const uint32_t exp = abs >> 23;
  if (exp >= 113u) {  // normal half (>= 2^-14): rebias and round 13 bits away
    return uint16_t(sign | fp8_detail::shift_right_rne(abs - (112u << 23), 13));
  }
  // Denormal half: an integer count of 2^-24; |x| = m * 2^(exp - 150).
  const int shift = 126 - int(exp);
  if (shift >= 25) return uint16_t(sign);
  const uint32_t m = (exp == 0) ? abs : ((abs & 0x7fffffu) | 0x800000u);
  return uint16_t(sign | fp8_detail::shift_right_rne(m, shift));
}

// Writes a float32 value into element `i` of a float32/bfloat16/float16
// array: RNE, NaN as the dtype's canonical quiet NaN (0x7FC00000 for
// float32, whose NaN bits otherwise differ between CPU and GPU arithmetic).
FP8KIT_HD void store_rounded(void* out, fp8kit_dtype dtype, int64_t i, float v) {
  if (dtype == FP8KIT_FLOAT32) {
    const bool nan = (float_to_bits(v) & 0x7fffffffu) > 0x7f800000u;
    static_cast<float*>(out)[i] = nan ? bits_to_float(0x7fc00000u) : v;
  } else if (dtype == FP8KIT_BFLOAT16) {
    static_cast<uint16_t*>(out)[i] = float_to_bf16_bits(v);
  } else {
    static_cast<uint16_t*>(out)[i] = float_to_fp16_bits(v);
  }
}

// The dequantized float32 value of one FP8 byte. NaN comes out as the
// canonical quiet NaN 0x7FC00000: a GPU multiply returns 0x7FFFFFFF for any
// NaN while an x86 multiply keeps the input's payload and sign, so without
// this float32 outputs would differ bitwise between CPU and CUDA.
FP8KIT_HD float dequantize_value(uint8_t q, fp8kit_dtype fp8_dtype, float scale_inv) {
  const float v = mul_rn(fp8_bits_to_float(q, fp8_dtype), scale_inv);
  return (float_to_bits(v) & 0x7fffffffu) > 0x7f800000u ? bits_to_float(0x7fc00000u) : v;
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_DEQUANTIZE_CONVERT_H_
