#include "amax_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "float_bits.h"

namespace fp8kit {
namespace {

// max |x| as the largest |x| bit pattern: for non-negative values the bit
// order is the value order, and every NaN pattern lies above +inf, so the
// maximum is NaN exactly when some element is NaN. One branch-free loop per
// dtype (16-bit formats compare their own 15-bit magnitudes).
template <typename Bits, uint32_t kAbsMask>
uint32_t max_abs_bits(const void* data, int64_t n) {
  const Bits* p = static_cast<const Bits*>(data);
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, uint32_t(p[i]) & kAbsMask);
  return m;
}

}  // namespace

float load_high_precision(const void* data, fp8kit_dtype dtype, int64_t i) {
  switch (dtype) {
    case FP8KIT_FLOAT32: return static_cast<const float*>(data)[i];
    case FP8KIT_BFLOAT16: return bf16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case FP8KIT_FLOAT16: return fp16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    default: return NAN;  // callers validate the dtype first
  }
}

float amax_cpu(const fp8kit_tensor& input) {
  const int64_t n = fp8kit_tensor_numel(&input);
  if (n == 0) return 0.0f;
  switch (input.dtype) {
    case FP8KIT_FLOAT32: {
      const uint32_t m = max_abs_bits<uint32_t, 0x7fffffffu>(input.data, n);
      return m > 0x7f800000u ? NAN : bits_to_float(m);
    }
    case FP8KIT_BFLOAT16: {
      const uint32_t m = max_abs_bits<uint16_t, 0x7fffu>(input.data, n);
      return m > 0x7f80u ? NAN : bf16_bits_to_float(uint16_t(m));
    }
    case FP8KIT_FLOAT16: {
      const uint32_t m = max_abs_bits<uint16_t, 0x7fffu>(input.data, n);
      return m > 0x7c00u ? NAN : fp16_bits_to_float(uint16_t(m));
    }
    default: return NAN;  // callers validate the dtype first
  }
}

}  // namespace fp8kit
