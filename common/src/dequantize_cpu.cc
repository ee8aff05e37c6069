#include "dequantize_cpu.h"

#include <cstdint>

#include "dequantize_convert.h"
#include "validate.h"

namespace fp8kit {
namespace {

void store(void* out, fp8kit_dtype dtype, int64_t i, float v) {
  switch (dtype) {
    case FP8KIT_FLOAT32: static_cast<float*>(out)[i] = v; break;
    case FP8KIT_BFLOAT16: static_cast<uint16_t*>(out)[i] = float_to_bf16_bits(v); break;
    default: static_cast<uint16_t*>(out)[i] = float_to_fp16_bits(v); break;
  }
}

}  // namespace

void dequantize_cpu(const fp8kit_tensor& input, fp8kit_tensor& output, bool from_columnwise) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  if (rows == 0 || cols == 0) return;
  const float scale_inv = *input.scale_inv;
  const uint8_t* q =
      static_cast<const uint8_t*>(from_columnwise ? input.columnwise_data : input.data);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      // Columnwise data is row-major [cols, rows].
      const uint8_t b = from_columnwise ? q[c * rows + r] : q[r * cols + c];
      store(output.data, output.dtype, r * cols + c, dequantize_value(b, input.dtype, scale_inv));
    }
  }
}

}  // namespace fp8kit
