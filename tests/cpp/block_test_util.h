// Helpers of the block-scaling tests: an independent model of the rule and
// layout of fp8kit/block_scaling.h, and one runner of
// fp8kit_quantize_block_scaling on the CPU or a GPU.
//
// Independence: the model is written from the header's text. Amax is a
// double max with an explicit NaN check, the scale a double division
// rounded once to float32 (correctly rounded: double carries more than the
// 2 * 24 + 2 bits that needs), the power of two taken with ilogb/ldexp, the
// FP8 code by qtest's nearest-value search, and every scale position by the
// header's index formulas spelled out here. It shares no code with the core.
#ifndef FP8KIT_TESTS_CPP_BLOCK_TEST_UTIL_H_
#define FP8KIT_TESTS_CPP_BLOCK_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace blocktest {

using qtest::Buffer;

// ------------------------------------------------------------- model --

// [outer, inner] of the scales of a stored copy [R, C], as the header says.
struct ScaleShape {
  int64_t outer, inner;
};
inline ScaleShape model_scale_shape(fp8kit_scaling_mode mode, int64_t R, int64_t C) {
  const int64_t blocks_c = (C + 127) / 128;
  if (mode == FP8KIT_SCALING_BLOCK_1X128) return {blocks_c, (R + 3) / 4 * 4};
  return {(R + 127) / 128, (blocks_c + 3) / 4 * 4};
}

// Position of the scale of stored element (r, c).
inline int64_t model_scale_index(fp8kit_scaling_mode mode, const ScaleShape& s, int64_t r,
                                 int64_t c) {
  return mode == FP8KIT_SCALING_BLOCK_1X128 ? (c / 128) * s.inner + r
                                            : (r / 128) * s.inner + c / 128;
}

// The scale of a block whose elements are `xs`.
inline float model_scale(const std::vector<float>& xs, fp8kit_dtype fp8, float epsilon,
                         bool power_2_scale) {
  double amax = 0.0;
  for (float x : xs) {
    if (std::isnan(x)) return 1.0f;
    amax = std::max(amax, std::fabs(double(x)));
  }
  if (amax == 0.0 || std::isinf(amax)) return 1.0f;
  const double denom = std::max(amax, double(epsilon));
  float scale = float(qtest::fp8_max_value(fp8) / denom);
  if (std::isinf(scale)) scale = FLT_MAX;
  if (scale < FLT_MIN) scale = FLT_MIN;
  if (power_2_scale) {
    // Down to a power of two, but not so far that the format's max times
    // scale_inv passes FLT_MAX.
    scale = float(std::ldexp(1.0, std::ilogb(scale)));
    if (qtest::fp8_max_value(fp8) / double(scale) > double(FLT_MAX)) scale *= 2.0f;
  }
  return scale;
}

// One copy of a tensor: FP8 bytes (stored [R, C]) and scales [outer, inner].
struct Copy {
  std::vector<uint8_t> data;
  std::vector<float> scales;
};

struct Spec {
  fp8kit_dtype in_dtype = FP8KIT_BFLOAT16;
  std::vector<int64_t> shape;
  fp8kit_dtype fp8 = FP8KIT_E4M3;
  fp8kit_scaling_mode mode = FP8KIT_SCALING_BLOCK_1X128;
  bool rowwise = true;
  bool columnwise = true;
  fp8kit_current_scaling_config config{0.0f, 0};
  // The input one element and the copies one byte off their buffers'
  // alignment (element-wise loads and byte stores whatever the shape).
  bool misaligned = false;
};

// The model's copy of a [rows, cols] input, rowwise or columnwise. Padding
// scales are 0.
inline Copy model_copy(const Spec& s, const std::vector<uint8_t>& input, bool columnwise) {
  const auto [rows, cols] = qtest::flat2d(s.shape);
  auto x = [&](int64_t r, int64_t c) {
    return qtest::input_value(input, s.in_dtype, size_t(r * cols + c));
  };
  // The stored copy [R, C] and its element (i, j) in the input.
  const int64_t R = columnwise ? cols : rows, C = columnwise ? rows : cols;
  auto stored = [&](int64_t i, int64_t j) { return columnwise ? x(j, i) : x(i, j); };
  const ScaleShape ss = model_scale_shape(s.mode, R, C);
  Copy out;
  out.data.assign(size_t(R * C), 0);
  out.scales.assign(size_t(ss.outer * ss.inner), 0.0f);
  const int64_t block_rows = s.mode == FP8KIT_SCALING_BLOCK_1X128 ? 1 : 128;
  for (int64_t i0 = 0; i0 < R; i0 += block_rows) {
    for (int64_t j0 = 0; j0 < C; j0 += 128) {
      const int64_t i1 = std::min(R, i0 + block_rows), j1 = std::min(C, j0 + 128);
      std::vector<float> xs;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) xs.push_back(stored(i, j));
      }
      const float scale =
          model_scale(xs, s.fp8, s.config.amax_epsilon, s.config.power_2_scale != 0);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) {
          out.data[size_t(i * C + j)] = qtest::ref_quantize(stored(i, j), scale, s.fp8);
        }
      }
      out.scales[size_t(model_scale_index(s.mode, ss, i0, j0))] = float(1.0 / double(scale));
    }
  }
  return out;
}

// ------------------------------------------------------------- runner --

struct Result {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  Copy rowwise, columnwise;
};

// Allocates the output copies the spec asks for (filled with 0xCD, so that
// unwritten bytes or scales show), quantizes, downloads.
inline Result run_quantize(fp8kit_device_type dev, const Spec& s,
                           const std::vector<uint8_t>& input) {
  const auto [rows, cols] = qtest::flat2d(s.shape);
  const size_t n = size_t(rows * cols);
  const ScaleShape rs = model_scale_shape(s.mode, rows, cols);
  const ScaleShape cs = model_scale_shape(s.mode, cols, rows);
  const size_t row_scales = size_t(rs.outer * rs.inner), col_scales = size_t(cs.outer * cs.inner);
  const size_t in_offset = s.misaligned ? fp8kit_dtype_size(s.in_dtype) : 0;
  const size_t out_offset = s.misaligned ? 1 : 0;
  Buffer in(dev, input.size(), in_offset), data(dev, n, out_offset),
      columnwise(dev, n, out_offset), scales(dev, row_scales * 4), cw_scales(dev, col_scales * 4);
  in.upload(input.data(), input.size());
  fp8kit_tensor ti = qtest::make_tensor(dev, s.in_dtype, s.shape, in.ptr());
  fp8kit_tensor to = qtest::make_tensor(dev, s.fp8, s.shape, s.rowwise ? data.ptr() : nullptr);
  to.scaling_mode = s.mode;
  to.block_scale_inv = s.rowwise ? scales.fptr() : nullptr;
  to.columnwise_data = s.columnwise ? columnwise.ptr() : nullptr;
  to.columnwise_block_scale_inv = s.columnwise ? cw_scales.fptr() : nullptr;
  Result r;
  r.status = fp8kit_quantize_block_scaling(&ti, &to, &s.config, nullptr);
  r.error = fp8kit_last_error();
  if (r.status != FP8KIT_OK) return r;
  auto floats = [](const std::vector<uint8_t>& b) {
    std::vector<float> f(b.size() / 4);
    if (!f.empty()) std::memcpy(f.data(), b.data(), b.size());
    return f;
  };
  if (s.rowwise) {
    r.rowwise.data = data.download(n);
    r.rowwise.scales = floats(scales.download(row_scales * 4));
  }
  if (s.columnwise) {
    r.columnwise.data = columnwise.download(n);
    r.columnwise.scales = floats(cw_scales.download(col_scales * 4));
  }
  return r;
}

// Byte-for-byte equality of two copies, scales compared as bits.
inline void expect_same_copy(const Copy& got, const Copy& want, const std::string& what) {
  ASSERT_EQ(got.data.size(), want.data.size()) << what;
  ASSERT_EQ(got.scales.size(), want.scales.size()) << what;
  for (size_t i = 0; i < got.data.size(); ++i) {
    if (got.data[i] != want.data[i]) {
      ADD_FAILURE() << what << ": byte " << i << " is 0x" << std::hex << int(got.data[i])
                    << ", want 0x" << int(want.data[i]) << std::dec;
      break;
    }
  }
  for (size_t i = 0; i < got.scales.size(); ++i) {
    if (qtest::float_bits(got.scales[i]) != qtest::float_bits(want.scales[i])) {
      ADD_FAILURE() << what << ": scale_inv " << i << " is " << got.scales[i] << ", want "
                    << want.scales[i];
      break;
    }
  }
}

inline std::string spec_name(const Spec& s) {
  std::string shape;
  for (int64_t d : s.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  return std::string(fp8kit_dtype_name(s.in_dtype)) + "->" + fp8kit_dtype_name(s.fp8) + " " +
         (s.mode == FP8KIT_SCALING_BLOCK_1X128 ? "1x128" : "128x128") + " [" + shape + "]" +
         (s.rowwise ? " rowwise" : "") + (s.columnwise ? " columnwise" : "") +
         (s.config.power_2_scale ? " pow2" : "") +
         (s.config.amax_epsilon > 0 ? " eps=" + std::to_string(s.config.amax_epsilon) : "") +
         (s.misaligned ? " misaligned" : "");
}

// All 65,536 bf16 bit patterns in order, as little-endian bytes.
inline std::vector<uint8_t> all_bf16_patterns() {
  std::vector<uint8_t> input(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    input[2 * i] = uint8_t(i & 0xff);
    input[2 * i + 1] = uint8_t(i >> 8);
  }
  return input;
}

}  // namespace blocktest

#endif  // FP8KIT_TESTS_CPP_BLOCK_TEST_UTIL_H_
