#include "amax_cpu.h"

#include <cmath>
#include <cstdint>

#include "float_bits.h"

namespace fp8kit {

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
  float result = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(load_high_precision(input.data, input.dtype, i));
    if (std::isnan(a)) return NAN;
    if (a > result) result = a;
  }
  return result;
}

}  // namespace fp8kit
