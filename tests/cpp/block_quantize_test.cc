// fp8kit_quantize_block_scaling and block-scaled fp8kit_dequantize on the
// CPU against the independent model of block_test_util.h: every bf16 bit
// pattern inside blocks, random data with an outlier per block, zero and
// non-finite blocks, partial edge blocks, both modes and formats, power-of-
// two scales and amax_epsilon; the scale layout and its padding; and every
// refused argument.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "block_test_util.h"
#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

using blocktest::Spec;

const fp8kit_scaling_mode kModes[] = {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128};

void expect_matches_model(const Spec& s, const std::vector<uint8_t>& input) {
  const std::string what = blocktest::spec_name(s);
  const blocktest::Result r = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
  ASSERT_EQ(r.status, FP8KIT_OK) << what << ": " << r.error;
  if (s.rowwise) {
    blocktest::expect_same_copy(r.rowwise, blocktest::model_copy(s, input, false),
                                what + " rowwise");
  }
  if (s.columnwise) {
    blocktest::expect_same_copy(r.columnwise, blocktest::model_copy(s, input, true),
                                what + " columnwise");
  }
}

// All 65,536 bf16 patterns, 128 consecutive ones per row: every 1x128
// rowwise tile and 128x128 block holds a slice of the patterns (NaN and inf
// tiles among them), and the [128, 512] arrangement puts them down the
// columns instead.
TEST(BlockScalingQuantize, AllBf16PatternsMatchModel) {
  const std::vector<uint8_t> input = blocktest::all_bf16_patterns();
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{512, 128}, {128, 512}}) {
    for (fp8kit_scaling_mode mode : kModes) {
      for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
        for (int pow2 : {0, 1}) {
          Spec s;
          s.shape = shape;
          s.mode = mode;
          s.fp8 = fp8;
          s.config.power_2_scale = pow2;
          expect_matches_model(s, input);
        }
      }
    }
  }
}

// Normal data with one outlier (x1000, either sign) in every 1x128 row tile,
// so every block's scale is set by its own outlier.
std::vector<float> with_outlier_per_tile(const std::vector<int64_t>& shape, uint32_t seed) {
  const auto [rows, cols] = qtest::flat2d(shape);
  std::vector<float> x = qtest::random_values(size_t(rows * cols), 1.0f, seed, false);
  std::mt19937 rng(seed + 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const int64_t width = std::min<int64_t>(128, cols - c0);
      const int64_t c = c0 + int64_t(rng() % uint32_t(width));
      x[size_t(r * cols + c)] = (rng() % 2 ? 1000.0f : -1000.0f) * (1.0f + float(r % 7));
    }
  }
  return x;
}

TEST(BlockScalingQuantize, RandomWithOutliersMatchModel) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1}, {}, {3, 5, 130}, {300, 260}, {128, 128}, {129, 1}, {1, 257}, {256, 384}};
  uint32_t seed = 11;
  for (const auto& shape : shapes) {
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (fp8kit_scaling_mode mode : kModes) {
        for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
          Spec s;
          s.in_dtype = in;
          s.shape = shape;
          s.mode = mode;
          s.fp8 = fp8;
          s.config.power_2_scale = int(seed % 2);
          const std::vector<uint8_t> input =
              qtest::encode_input(with_outlier_per_tile(shape, seed++), in);
          expect_matches_model(s, input);
        }
      }
    }
  }
}

TEST(BlockScalingQuantize, OneCopyAtATimeAndEpsilonMatchModel) {
  const std::vector<int64_t> shape = {200, 300};
  const std::vector<uint8_t> input =
      qtest::encode_input(qtest::random_values(200 * 300, 1e-3f, 5, true), FP8KIT_FLOAT32);
  for (fp8kit_scaling_mode mode : kModes) {
    for (bool rowwise : {true, false}) {
      Spec s;
      s.in_dtype = FP8KIT_FLOAT32;
      s.shape = shape;
      s.mode = mode;
      s.rowwise = rowwise;
      s.columnwise = !rowwise;
      s.config.amax_epsilon = 0.5f;  // larger than most tiles' amax: caps their scale
      expect_matches_model(s, input);
    }
  }
}

// Blocks of a [256, 256] tensor: (0,0) zeros (and -0), (0,1) holding a NaN,
// (1,0) holding +inf, (1,1) ordinary values; checked against the model and
// against the rule's stated outcomes, in both formats.
TEST(BlockScalingQuantize, ZeroAndNonFiniteBlocks) {
  std::vector<float> x = qtest::random_values(256 * 256, 2.0f, 3, false);
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 128; ++c) x[size_t(r * 256 + c)] = (r + c) % 2 ? 0.0f : -0.0f;
  }
  x[size_t(5 * 256 + 200)] = NAN;
  x[size_t(200 * 256 + 5)] = INFINITY;
  const std::vector<uint8_t> input = qtest::encode_input(x, FP8KIT_FLOAT32);
  for (auto [mode, fp8] : {std::pair{FP8KIT_SCALING_BLOCK_1X128, FP8KIT_E4M3},
                           {FP8KIT_SCALING_BLOCK_128X128, FP8KIT_E4M3},
                           {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_E5M2}}) {
    Spec s;
    s.in_dtype = FP8KIT_FLOAT32;
    s.shape = {256, 256};
    s.mode = mode;
    s.fp8 = fp8;
    expect_matches_model(s, input);
    const blocktest::Result r = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.rowwise.data[0], 0x80) << "-0 keeps its sign";
    EXPECT_EQ(r.rowwise.data[1], 0x00);
    EXPECT_EQ(r.rowwise.data[size_t(5 * 256 + 200)], 0x7f) << "NaN stays NaN";
    EXPECT_EQ(r.rowwise.data[size_t(200 * 256 + 5)], fp8 == FP8KIT_E4M3 ? 0x7f : 0x7c)
        << "inf becomes NaN (E4M3) or stays inf (E5M2)";
    // The blocks (or the row tiles) holding the zero, NaN and inf: scale 1.
    const blocktest::ScaleShape ss = blocktest::model_scale_shape(mode, 256, 256);
    for (auto [r0, c0] : {std::pair<int, int>{0, 0}, {5, 200}, {200, 5}}) {
      EXPECT_EQ(r.rowwise.scales[size_t(blocktest::model_scale_index(mode, ss, r0, c0))], 1.0f)
          << "block of element (" << r0 << ", " << c0 << ")";
    }
    // An inf makes the rest of its block cast unscaled.
    const size_t beside_inf = size_t(200 * 256 + 6);
    EXPECT_EQ(r.rowwise.data[beside_inf], qtest::ref_encode(x[beside_inf], fp8));
  }
}

// Scales sit where the header says, padding is 0, and the public shape
// function agrees with the model.
TEST(BlockScalingQuantize, ScaleShapeAndPadding) {
  for (fp8kit_scaling_mode mode : kModes) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{130, 3, 5}, {1, 1}, {}, {0, 256}, {256, 0}, {513, 129}}) {
      fp8kit_tensor t = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, nullptr);
      t.scaling_mode = mode;
      const auto [rows, cols] = qtest::flat2d(shape);
      for (int columnwise : {0, 1}) {
        int64_t got[2] = {-1, -1};
        ASSERT_EQ(fp8kit_block_scale_inv_shape(&t, columnwise, got), FP8KIT_OK)
            << fp8kit_last_error();
        const blocktest::ScaleShape want = columnwise
                                               ? blocktest::model_scale_shape(mode, cols, rows)
                                               : blocktest::model_scale_shape(mode, rows, cols);
        EXPECT_EQ(got[0], want.outer);
        EXPECT_EQ(got[1], want.inner);
        EXPECT_EQ(got[1] % 4, 0) << "inner dimension padded to 16 bytes";
      }
    }
  }
  // 1x128 rowwise scales of a [5, 130] tensor: inner 8, rows 5..7 padding.
  Spec s;
  s.shape = {5, 130};
  s.in_dtype = FP8KIT_FLOAT32;
  const std::vector<uint8_t> input =
      qtest::encode_input(qtest::random_values(5 * 130, 1.0f, 9, false), FP8KIT_FLOAT32);
  const blocktest::Result r = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  ASSERT_EQ(r.rowwise.scales.size(), 16u);
  for (int j = 0; j < 2; ++j) {
    for (int i = 5; i < 8; ++i) EXPECT_EQ(r.rowwise.scales[size_t(j * 8 + i)], 0.0f);
    for (int i = 0; i < 5; ++i) EXPECT_GT(r.rowwise.scales[size_t(j * 8 + i)], 0.0f);
  }
}

// Dequantizing either copy gives q * its block's scale_inv at the logical
// position (the model's decoding), for both modes.
TEST(BlockScalingQuantize, DequantizeBothCopies) {
  const std::vector<int64_t> shape = {300, 260};
  const std::vector<uint8_t> input =
      qtest::encode_input(with_outlier_per_tile(shape, 21), FP8KIT_BFLOAT16);
  for (fp8kit_scaling_mode mode : kModes) {
    Spec s;
    s.shape = shape;
    s.mode = mode;
    const blocktest::Copy copies[2] = {blocktest::model_copy(s, input, false),
                                       blocktest::model_copy(s, input, true)};
    for (int from_columnwise : {0, 1}) {
      const blocktest::Copy& c = copies[from_columnwise];
      std::vector<float> out(300 * 260, -1.0f);
      fp8kit_tensor ti = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape,
                                            from_columnwise ? nullptr : (void*)c.data.data());
      ti.scaling_mode = mode;
      ti.columnwise_data = from_columnwise ? (void*)c.data.data() : nullptr;
      std::vector<float> scales(c.scales.size() + 4);
      float* aligned =
          scales.data() + (4 - reinterpret_cast<uintptr_t>(scales.data()) % 16 / 4) % 4;
      std::copy(c.scales.begin(), c.scales.end(), aligned);
      (from_columnwise ? ti.columnwise_block_scale_inv : ti.block_scale_inv) = aligned;
      fp8kit_tensor to = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, out.data());
      ASSERT_EQ(fp8kit_dequantize(&ti, &to, from_columnwise, nullptr), FP8KIT_OK)
          << fp8kit_last_error();
      const blocktest::ScaleShape ss = from_columnwise
                                           ? blocktest::model_scale_shape(mode, 260, 300)
                                           : blocktest::model_scale_shape(mode, 300, 260);
      for (int64_t r = 0; r < 300; ++r) {
        for (int64_t col = 0; col < 260; ++col) {
          const int64_t i = from_columnwise ? col : r, j = from_columnwise ? r : col;
          const double want =
              qtest::decode_fp8(c.data[size_t(i * (from_columnwise ? 300 : 260) + j)],
                                FP8KIT_E4M3) *
              double(c.scales[size_t(blocktest::model_scale_index(mode, ss, i, j))]);
          ASSERT_EQ(out[size_t(r * 260 + col)], float(want))
              << "mode " << int(mode) << " from_columnwise " << from_columnwise << " at (" << r
              << ", " << col << ")";
        }
      }
    }
  }
}

// ------------------------------------------------------------ errors --

struct ErrorCase {
  fp8kit_tensor in, out;
  std::vector<uint8_t> in_bytes, data, columnwise;
  std::vector<float> scales, cw_scales;
};

// A valid CPU call on a [4, 256] bf16 tensor, 1x128, both copies.
ErrorCase valid_case() {
  ErrorCase c;
  c.in_bytes.assign(4 * 256 * 2, 0);
  c.data.assign(4 * 256, 0);
  c.columnwise.assign(4 * 256, 0);
  c.scales.assign(2 * 4 + 3, 0.0f);      // [2, 4], room to align
  c.cw_scales.assign(1 * 256 + 3, 0.0f);  // [1, 256]
  const std::vector<int64_t> shape = {4, 256};
  c.in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_BFLOAT16, shape, c.in_bytes.data());
  c.out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, c.data.data());
  c.out.scaling_mode = FP8KIT_SCALING_BLOCK_1X128;
  c.out.columnwise_data = c.columnwise.data();
  auto align16 = [](std::vector<float>& v) {
    return v.data() + (4 - reinterpret_cast<uintptr_t>(v.data()) % 16 / 4) % 4;
  };
  c.out.block_scale_inv = align16(c.scales);
  c.out.columnwise_block_scale_inv = align16(c.cw_scales);
  return c;
}

void expect_refused(ErrorCase& c, const std::string& needle) {
  const fp8kit_current_scaling_config config{0.0f, 1};
  EXPECT_EQ(fp8kit_quantize_block_scaling(&c.in, &c.out, &config, nullptr),
            FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find(needle), std::string::npos)
      << "message: " << fp8kit_last_error() << "\nexpected to mention: " << needle;
}

TEST(BlockScalingQuantize, RefusesBadArguments) {
  {
    ErrorCase c = valid_case();
    const fp8kit_current_scaling_config config{0.0f, 1};
    ASSERT_EQ(fp8kit_quantize_block_scaling(&c.in, &c.out, &config, nullptr), FP8KIT_OK)
        << fp8kit_last_error();
  }
  {
    ErrorCase c = valid_case();
    c.out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    expect_refused(c, "FP8KIT_SCALING_BLOCK_1X128");
  }
  {
    ErrorCase c = valid_case();
    float amax = 0.0f;
    c.out.amax = &amax;
    expect_refused(c, "set scale, scale_inv and amax to NULL");
  }
  {
    ErrorCase c = valid_case();
    c.out.block_scale_inv = nullptr;
    expect_refused(c, "output->block_scale_inv is NULL");
  }
  {
    ErrorCase c = valid_case();
    c.out.columnwise_data = nullptr;
    expect_refused(c, "output->columnwise_block_scale_inv is set but output->columnwise_data");
  }
  {
    ErrorCase c = valid_case();
    c.out.data = nullptr;
    c.out.block_scale_inv = nullptr;
    c.out.columnwise_data = nullptr;
    c.out.columnwise_block_scale_inv = nullptr;
    expect_refused(c, "neither data nor columnwise_data");
  }
  {
    ErrorCase c = valid_case();
    c.out.block_scale_inv += 1;
    expect_refused(c, "16-byte aligned");
  }
  {
    ErrorCase c = valid_case();
    c.out.dtype = FP8KIT_BFLOAT16;
    expect_refused(c, "output");
  }
  {
    ErrorCase c = valid_case();
    const fp8kit_current_scaling_config config{NAN, 0};
    EXPECT_EQ(fp8kit_quantize_block_scaling(&c.in, &c.out, &config, nullptr),
              FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find("amax_epsilon"), std::string::npos);
  }
  {
    // Per-tensor quantize refuses a block-scaled output, naming the entry point.
    ErrorCase c = valid_case();
    float scale = 1.0f;
    c.out.scale = &scale;
    EXPECT_EQ(fp8kit_quantize(&c.in, &c.out, nullptr), FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find("fp8kit_quantize_block_scaling"),
              std::string::npos)
        << fp8kit_last_error();
  }
  {
    // Dequantize needs the scales of the copy it reads.
    ErrorCase c = valid_case();
    std::vector<float> out(4 * 256);
    fp8kit_tensor to =
        qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {4, 256}, out.data());
    c.out.columnwise_block_scale_inv = nullptr;
    EXPECT_EQ(fp8kit_dequantize(&c.out, &to, 1, nullptr), FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find("columnwise_block_scale_inv is NULL"),
              std::string::npos)
        << fp8kit_last_error();
  }
  {
    fp8kit_tensor t = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {4, 4}, nullptr);
    t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    int64_t shape[2];
    EXPECT_EQ(fp8kit_block_scale_inv_shape(&t, 0, shape), FP8KIT_INVALID_ARGUMENT);
  }
}

}  // namespace
