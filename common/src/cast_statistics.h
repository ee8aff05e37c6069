// fp8kit_cast_statistics_of inside the core: the per-element rule (host
// and device inline, so the CPU reference and the CUDA kernel classify and
// dequantize every element identically) and the CPU entry point the C API
// dispatches to after validating (the CUDA one is in cuda_backend.h).
#ifndef FP8KIT_SRC_CAST_STATISTICS_H_
#define FP8KIT_SRC_CAST_STATISTICS_H_

#include <cstdint>

#include "dequantize_convert.h"
#include "float_bits.h"
#include "fp8kit/statistics.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// The code of +fp8_max with the sign bit clear: 0x7E (448) in E4M3, 0x7B
// (57344) in E5M2.
FP8KIT_HD uint32_t fp8_max_code(fp8kit_dtype fp8_dtype) {
  return fp8_dtype == FP8KIT_E4M3 ? 0x7eu : 0x7bu;
}

// Statistics of a run of elements. `Real` is what the sums accumulate in
// (double on both sides; fp8kit/statistics.h states the bounds). amax is
// kept as the largest |x| float32 bit pattern: for non-negative floats the
// bit order is the value order and every NaN lies above +inf, so the
// maximum is NaN exactly when some element is, whatever the order.
template <typename Real>
struct CastStatsPartial {
  uint32_t amax_bits = 0;
  uint32_t underflow = 0;
  uint32_t saturated = 0;
  Real error_sq = 0;
  Real norm_sq = 0;

  // x: the input element (exact in float32); q: its FP8 code; scale_inv:
  // the tensor's or its block's.
  FP8KIT_HD void add(float x, uint8_t q, fp8kit_dtype fp8_dtype, float scale_inv) {
    const uint32_t abs_bits = float_to_bits(x) & 0x7fffffffu;
    if (abs_bits > amax_bits) amax_bits = abs_bits;
    if (abs_bits >= 0x7f800000u) return;  // +-inf or NaN: amax only
    const uint32_t magnitude = q & 0x7fu;
    underflow += (magnitude == 0 && abs_bits != 0) ? 1u : 0u;
    saturated += magnitude == fp8_max_code(fp8_dtype) ? 1u : 0u;
    // dequantize_value is fp8kit_dequantize's own float32 value.
    const Real diff = Real(dequantize_value(q, fp8_dtype, scale_inv)) - Real(x);
    error_sq += diff * diff;
    norm_sq += Real(x) * Real(x);
  }
};

// amax as fp8kit_amax writes it: the canonical quiet NaN for any NaN.
FP8KIT_HD float amax_from_bits(uint32_t amax_bits) {
  return bits_to_float(amax_bits > 0x7f800000u ? 0x7fc00000u : amax_bits);
}

// CPU reference; arguments validated, outputs host pointers. row_scale_inv:
// NULL, or one scale_inv per row of the rowwise copy
// (fp8kit_cast_statistics_of_rows), which then replaces the tensor's.
void cast_statistics_cpu(const fp8kit_tensor& input, const fp8kit_tensor& quantized,
                         bool from_columnwise, const float* row_scale_inv,
                         const fp8kit_cast_statistics& out);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_CAST_STATISTICS_H_
