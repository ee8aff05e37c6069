// The summation order of fp8kit_column_sums (fp8kit/column_sums.h),
// written once for the CPU reference and the CUDA kernel: float32 adds that
// are never contracted (the final rounding to the output dtype is
// store_rounded, dequantize_convert.h).
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

}  // namespace fp8kit

#endif  // FP8KIT_SRC_COLUMN_SUMS_H_
