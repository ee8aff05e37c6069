#include "quantize_cpu.h"

#include <algorithm>
#include <cmath>

#include "amax_cpu.h"
#include "compute_scale.h"
#include "element_load.h"
#include "float_bits.h"
#include "fp8_convert.h"
#include "validate.h"

namespace fp8kit {
namespace {

// One pass in 64x64 tiles, so the transposed writes stay in cache. Amax is
// kept as the largest |x| bit pattern: for non-negative floats the bit
// order is the value order, and every NaN pattern is above +inf.
template <typename Load, bool kE4M3>
float quantize_2d(const void* in, int64_t rows, int64_t cols, float scale, uint8_t* data,
                  uint8_t* columnwise) {
  constexpr int64_t kTile = 64;
  uint32_t amax_bits = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const float x = Load::load(in, r * cols + c);
          amax_bits = std::max(amax_bits, float_to_bits(x) & 0x7fffffffu);
          const uint8_t q = quantize_to_fp8<kE4M3>(x, scale);
          if (data) data[r * cols + c] = q;
          if (columnwise) columnwise[c * rows + r] = q;
        }
      }
    }
  }
  return amax_bits > 0x7f800000u ? NAN : bits_to_float(amax_bits);
}

template <typename Load>
float quantize_2d_fmt(const void* in, int64_t rows, int64_t cols, float scale,
                      fp8kit_dtype fp8_dtype, uint8_t* data, uint8_t* columnwise) {
  return fp8_dtype == FP8KIT_E4M3
             ? quantize_2d<Load, true>(in, rows, cols, scale, data, columnwise)
             : quantize_2d<Load, false>(in, rows, cols, scale, data, columnwise);
}

}  // namespace

float quantize_cpu(const fp8kit_tensor& input, float scale, fp8kit_dtype fp8_dtype, uint8_t* data,
                   uint8_t* columnwise) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  if (rows == 0 || cols == 0) return 0.0f;
  switch (input.dtype) {
    case FP8KIT_FLOAT32:
      return quantize_2d_fmt<LoadF32>(input.data, rows, cols, scale, fp8_dtype, data, columnwise);
    case FP8KIT_BFLOAT16:
      return quantize_2d_fmt<LoadBF16>(input.data, rows, cols, scale, fp8_dtype, data, columnwise);
    default:
      return quantize_2d_fmt<LoadF16>(input.data, rows, cols, scale, fp8_dtype, data, columnwise);
  }
}

void quantize_delayed_cpu(const fp8kit_tensor& input, fp8kit_tensor& output) {
  const float scale = checked_scale(*output.scale);
  const float amax = quantize_cpu(input, scale, output.dtype, static_cast<uint8_t*>(output.data),
                                  static_cast<uint8_t*>(output.columnwise_data));
  if (output.amax) *output.amax = amax;
  if (output.scale_inv) *output.scale_inv = reciprocal(scale);
}

void quantize_current_scaling_cpu(const fp8kit_tensor& input, fp8kit_tensor& output,
                                  const fp8kit_current_scaling_config& config) {
  const float amax = amax_cpu(input);
  const float scale = current_scale_from_amax(amax, fp8kit_fp8_max(output.dtype),
                                              config.amax_epsilon, config.power_2_scale != 0);
  quantize_cpu(input, scale, output.dtype, static_cast<uint8_t*>(output.data),
               static_cast<uint8_t*>(output.columnwise_data));
  *output.amax = amax;
  *output.scale = scale;
  *output.scale_inv = reciprocal(scale);
}

}  // namespace fp8kit
