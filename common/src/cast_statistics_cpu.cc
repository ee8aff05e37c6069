// CPU reference of fp8kit_cast_statistics_of: one pass in the logical
// element order, sums in double (fp8kit/statistics.h).
#include <cstdint>

#include "block_scale_layout.h"
#include "cast_statistics.h"
#include "element_load.h"
#include "validate.h"

namespace fp8kit {
namespace {

// One loop per input dtype, so the load is not a switch per element.
template <typename Load>
CastStatsPartial<double> accumulate(const fp8kit_tensor& input, const fp8kit_tensor& quantized,
                                    bool from_columnwise, const float* row_scale_inv,
                                    int64_t rows, int64_t cols) {
  const uint8_t* q =
      static_cast<const uint8_t*>(from_columnwise ? quantized.columnwise_data : quantized.data);
  const bool block = is_block_scaling(quantized.scaling_mode);
  const float* scales = !block           ? quantized.scale_inv
                        : from_columnwise ? quantized.columnwise_block_scale_inv
                                          : quantized.block_scale_inv;
  // The blocks of the copy as stored: [rows, cols], or [cols, rows] for the
  // columnwise copy, whose stored element (c, r) is logical element (r, c).
  const BlockScaleLayout layout = from_columnwise
                                      ? BlockScaleLayout::of(quantized.scaling_mode, cols, rows)
                                      : BlockScaleLayout::of(quantized.scaling_mode, rows, cols);
  CastStatsPartial<double> acc;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t code = from_columnwise ? q[c * rows + r] : q[r * cols + c];
      const float scale_inv =
          row_scale_inv != nullptr ? row_scale_inv[r]
          : !block                 ? *scales
                                   : scales[from_columnwise ? layout.index(c, r) : layout.index(r, c)];
      acc.add(Load::load(input.data, r * cols + c), code, quantized.dtype, scale_inv);
    }
  }
  return acc;
}

}  // namespace

void cast_statistics_cpu(const fp8kit_tensor& input, const fp8kit_tensor& quantized,
                         bool from_columnwise, const float* row_scale_inv,
                         const fp8kit_cast_statistics& out) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  CastStatsPartial<double> acc;
  if (rows > 0 && cols > 0) {
    switch (input.dtype) {
      case FP8KIT_FLOAT32:
        acc = accumulate<LoadF32>(input, quantized, from_columnwise, row_scale_inv, rows,
                                  cols);
        break;
      case FP8KIT_BFLOAT16:
        acc = accumulate<LoadBF16>(input, quantized, from_columnwise, row_scale_inv, rows,
                                  cols);
        break;
      default:
        acc = accumulate<LoadF16>(input, quantized, from_columnwise, row_scale_inv, rows,
                                  cols);
        break;
    }
  }
  *out.amax = amax_from_bits(acc.amax_bits);
  *out.underflow = acc.underflow;
  *out.saturated = acc.saturated;
  *out.error_sq = float(acc.error_sq);
  *out.norm_sq = float(acc.norm_sq);
}

}  // namespace fp8kit
