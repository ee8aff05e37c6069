#include "quantize_block_cpu.h"

#include <algorithm>
#include <cstdint>

#include "block_scale_layout.h"
#include "compute_scale.h"
#include "element_load.h"
#include "float_bits.h"
#include "fp8_convert.h"
#include "validate.h"

namespace fp8kit {
namespace {

struct BlockRule {
  fp8kit_dtype fp8_dtype;
  float fp8_max;
  float amax_epsilon;
  bool power_2_scale;
};

// One block: the rectangle [r0, r1) x [c0, c1) of the [rows, cols] input.
struct Rect {
  int64_t r0, r1, c0, c1;
};

// The block's scale from its amax. Amax is kept as the largest |x| bit
// pattern: for non-negative floats the bit order is the value order, and
// every NaN pattern is above +inf.
template <typename Load>
float block_scale(const void* in, int64_t cols, const Rect& b, const BlockRule& rule) {
  uint32_t amax_bits = 0;
  for (int64_t r = b.r0; r < b.r1; ++r) {
    for (int64_t c = b.c0; c < b.c1; ++c) {
      amax_bits = std::max(amax_bits, float_to_bits(Load::load(in, r * cols + c)) & 0x7fffffffu);
    }
  }
  const float amax = bits_to_float(amax_bits);  // a NaN pattern stays NaN
  return current_scale_from_amax(amax, rule.fp8_max, rule.amax_epsilon, rule.power_2_scale);
}

// q of every element of the block into the rowwise copy ([rows, cols]) and/or
// the columnwise copy ([cols, rows]), whichever is non-NULL.
template <typename Load>
void cast_block(const void* in, int64_t rows, int64_t cols, const Rect& b, float scale,
                fp8kit_dtype fp8_dtype, uint8_t* data, uint8_t* columnwise) {
  for (int64_t r = b.r0; r < b.r1; ++r) {
    for (int64_t c = b.c0; c < b.c1; ++c) {
      const uint8_t q = quantize_to_fp8(Load::load(in, r * cols + c), scale, fp8_dtype);
      if (data) data[r * cols + c] = q;
      if (columnwise) columnwise[c * rows + r] = q;
    }
  }
}

void zero_padding(const BlockScaleLayout& l, float* scales) {
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = l.used_inner; i < l.inner; ++i) scales[o * l.inner + i] = 0.0f;
  }
}

template <typename Load>
void quantize_blocks(const void* in, int64_t rows, int64_t cols, fp8kit_scaling_mode mode,
                     const BlockRule& rule, fp8kit_tensor& out) {
  uint8_t* data = static_cast<uint8_t*>(out.data);
  uint8_t* columnwise = static_cast<uint8_t*>(out.columnwise_data);
  const BlockScaleLayout row_layout = BlockScaleLayout::of(mode, rows, cols);
  const BlockScaleLayout col_layout = BlockScaleLayout::of(mode, cols, rows);
  if (mode == FP8KIT_SCALING_BLOCK_128X128) {
    for (int64_t r0 = 0; r0 < rows; r0 += kBlockLen) {
      for (int64_t c0 = 0; c0 < cols; c0 += kBlockLen) {
        const Rect b{r0, std::min(rows, r0 + kBlockLen), c0, std::min(cols, c0 + kBlockLen)};
        const float scale = block_scale<Load>(in, cols, b, rule);
        cast_block<Load>(in, rows, cols, b, scale, rule.fp8_dtype, data, columnwise);
        const float scale_inv = reciprocal(scale);
        if (data) out.block_scale_inv[row_layout.index(r0, c0)] = scale_inv;
        if (columnwise) out.columnwise_block_scale_inv[col_layout.index(c0, r0)] = scale_inv;
      }
    }
  } else {
    // 1x128: the rowwise copy's tiles run along a row, the columnwise
    // copy's along a column of the input.
    for (int64_t r = 0; data && r < rows; ++r) {
      for (int64_t c0 = 0; c0 < cols; c0 += kBlockLen) {
        const Rect b{r, r + 1, c0, std::min(cols, c0 + kBlockLen)};
        const float scale = block_scale<Load>(in, cols, b, rule);
        cast_block<Load>(in, rows, cols, b, scale, rule.fp8_dtype, data, nullptr);
        out.block_scale_inv[row_layout.index(r, c0)] = reciprocal(scale);
      }
    }
    for (int64_t c = 0; columnwise && c < cols; ++c) {
      for (int64_t r0 = 0; r0 < rows; r0 += kBlockLen) {
        const Rect b{r0, std::min(rows, r0 + kBlockLen), c, c + 1};
        const float scale = block_scale<Load>(in, cols, b, rule);
        cast_block<Load>(in, rows, cols, b, scale, rule.fp8_dtype, nullptr, columnwise);
        out.columnwise_block_scale_inv[col_layout.index(c, r0)] = reciprocal(scale);
      }
    }
  }
  if (data) zero_padding(row_layout, out.block_scale_inv);
  if (columnwise) zero_padding(col_layout, out.columnwise_block_scale_inv);
}

}  // namespace

void quantize_block_scaling_cpu(const fp8kit_tensor& input, fp8kit_tensor& output,
                                const fp8kit_current_scaling_config& config) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  if (rows == 0 || cols == 0) return;
  const BlockRule rule{output.dtype, fp8kit_fp8_max(output.dtype), config.amax_epsilon,
                       config.power_2_scale != 0};
  switch (input.dtype) {
    case FP8KIT_FLOAT32:
      return quantize_blocks<LoadF32>(input.data, rows, cols, output.scaling_mode, rule, output);
    case FP8KIT_BFLOAT16:
      return quantize_blocks<LoadBF16>(input.data, rows, cols, output.scaling_mode, rule, output);
    default:
      return quantize_blocks<LoadF16>(input.data, rows, cols, output.scaling_mode, rule, output);
  }
}

}  // namespace fp8kit
