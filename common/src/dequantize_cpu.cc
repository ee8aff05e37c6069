#include "dequantize_cpu.h"

#include <cstdint>

#include "block_scale_layout.h"
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
  const uint8_t* q =
      static_cast<const uint8_t*>(from_columnwise ? input.columnwise_data : input.data);
  const bool block = is_block_scaling(input.scaling_mode);
  const float* block_scales =
      from_columnwise ? input.columnwise_block_scale_inv : input.block_scale_inv;
  // Blocks are laid out over the copy as stored: [rows, cols] or [cols, rows].
  const BlockScaleLayout layout = from_columnwise
                                      ? BlockScaleLayout::of(input.scaling_mode, cols, rows)
                                      : BlockScaleLayout::of(input.scaling_mode, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t b = from_columnwise ? q[c * rows + r] : q[r * cols + c];
      const float scale_inv =
          !block ? *input.scale_inv
                 : block_scales[from_columnwise ? layout.index(c, r) : layout.index(r, c)];
      store(output.data, output.dtype, r * cols + c, dequantize_value(b, input.dtype, scale_inv));
    }
  }
}

}  // namespace fp8kit
