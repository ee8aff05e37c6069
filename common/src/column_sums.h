// The summation order of fp8kit_column_sums (fp8kit/column_sums.h),
// written once for the CPU reference and the CUDA kernel: float32 adds that are never contracted, and the final rounding to
// the output dtype.
#ifndef FP8KIT_SRC_COLUMN_SUMS_H_
#define FP8KIT_SRC_COLUMN_SUMS_H_

#include <cstdint>

#include "dequantize_convert.h"
#include "float_bits.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

constexpr int kSumTileRows = 128;  // rows per tile (the cast+transpose kernel's tile)
constexpr int kSumGroupRows = 8;   // rows per group (one thread's rows in that kernel)

// a + b, correctly rounded, never contracted into an FMA.
FP8KIT_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Writes one column sum into element `i` of a float32/bfloat16/float16
// array (RNE; NaN as the dtype's canonical quiet NaN).
FP8KIT_HD void store_column_sum(void* out, fp8kit_dtype dtype, int64_t i, float total) {
  if (dtype == FP8KIT_FLOAT32) {
    const bool nan = (float_to_bits(total) & 0x7fffffffu) > 0x7f800000u;
    static_cast<float*>(out)[i] = nan ? bits_to_float(0x7fc00000u) : total;
  } else if (dtype == FP8KIT_BFLOAT16) {
    static_cast<uint16_t*>(out)[i] = float_to_bf16_bits(total);
  } else {
    static_cast<uint16_t*>(out)[i] = float_to_fp16_bits(total);
  }
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_COLUMN_SUMS_H_
