// fp8kit_cast_statistics_of: crafted tensors whose underflow and saturation
// counts are known by construction (exact zeros, values just either side of
// half the smallest subnormal, clipped and exact fp8_max values, inf and NaN
// left out), random tensors against the independent double-precision
// reference of statistics_test_util.h, both formats, per-tensor and both
// block modes, rowwise and columnwise, the errors; on a GPU, CUDA against
// the CPU (amax and counts bit for bit, sums within the header's 1e-5). The
// FP8 copies come from the core's own quantize functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"
#include "statistics_test_util.h"

namespace {

using stattest::Case;
using stattest::expect_matches_reference;
using stattest::expect_sum;
using stattest::kFormats;
using stattest::kModes;
using stattest::make_case;
using stattest::min_subnormal;
using stattest::run_stats;
using stattest::Shape;
using stattest::Stats;

// -------------------------------------------------------- crafted, CPU --

// Per-tensor scale 4: x * 4 below half the smallest subnormal underflows,
// beyond fp8_max (or at it) saturates.
TEST(CastStatistics, CraftedPerTensorCounts) {
  const float scale = 4.0f;
  for (fp8kit_dtype fp8 : kFormats) {
    const float max = float(qtest::fp8_max_value(fp8)), sub = min_subnormal(fp8);
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16}) {
      for (int specials = 0; specials < 3; ++specials) {  // none, inf, inf and NaN
        std::vector<float> x(5 * 40);
        for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 ? -0.5f : 0.5f) * float(1 + i % 5);
        size_t k = 0;
        auto put = [&](float v) { x[(k++ * 37) % x.size()] = v; };
        for (float t : {sub / 16, -sub / 16, sub / 8, sub / 64, -sub / 8}) put(t / scale);
        put(sub / 2 / scale);      // exactly half: a tie, to even (+0), so underflow too
        const unsigned underflow = 6;
        put(0.75f * sub / scale);  // rounds up to the smallest subnormal
        put(0.0f);                 // exact zeros are not underflow
        put(-0.0f);
        for (float t : {2 * max, -max, 1e6f * max}) put(t / scale);  // clipped, exact max, clipped
        const unsigned saturated = 3;
        put(max / scale * 0.9f);   // in range
        if (specials >= 1) put(INFINITY), put(-INFINITY);
        if (specials >= 2) put(NAN);
        const Case c = make_case(in, {5, 40}, x, fp8, FP8KIT_SCALING_PER_TENSOR, scale);
        for (bool cw : {false, true}) {
          const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, cw);
          ASSERT_EQ(s.status, FP8KIT_OK) << c.name << ": " << s.error;
          EXPECT_EQ(s.underflow, underflow) << c.name;
          EXPECT_EQ(s.saturated, saturated) << c.name;
          if (specials == 2) {
            EXPECT_EQ(qtest::float_bits(s.amax), 0x7fc00000u) << c.name;
          } else if (specials == 1) {
            EXPECT_EQ(s.amax, INFINITY) << c.name;
          } else {
            EXPECT_GT(s.amax, 1e5f * max / scale) << c.name;
          }
          EXPECT_TRUE(std::isfinite(s.error_sq) && std::isfinite(s.norm_sq)) << c.name;
          expect_matches_reference(c, cw);
        }
      }
    }
  }
}

// Every 1x128 tile, 128x1 tile and 128x128 block of a [256, 256] tensor
// holds +-fp8_max (its amax), so every block's scale is 1 and the counts are
// those of a plain cast. An inf and a NaN sit in the row tile, column tile
// and block of one 2 * fp8_max, which their blocks therefore cast at scale
// 1 too (fp8kit/block_scaling.h), so it saturates in every mode.
TEST(CastStatistics, CraftedBlockCounts) {
  for (fp8kit_dtype fp8 : kFormats) {
    const float max = float(qtest::fp8_max_value(fp8)), sub = min_subnormal(fp8);
    std::vector<float> x(256 * 256);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 ? 0.5f : -1.0f) + float(i % 97) / 64;
    unsigned saturated = 0;
    for (int r = 0; r < 256; ++r) {
      for (int c = 0; c < 256; ++c) {
        if (c % 128 == r % 128) {
          x[size_t(r * 256 + c)] = (r + c) % 2 ? max : -max;
          ++saturated;
        }
      }
    }
    x[0 * 256 + 5] = INFINITY;
    x[3 * 256 + 7] = NAN;
    x[0 * 256 + 7] = 2 * max;
    ++saturated;
    const int tiny_at[] = {1000, 2001, 30000, 40003, 65000};
    for (int i : tiny_at) x[size_t(i)] = (i % 2 ? -sub : sub) / 4;
    x[50001] = 0.75f * sub;  // rounds up to the smallest subnormal
    x[50002] = 0.0f;
    x[50003] = -0.0f;
    for (fp8kit_scaling_mode mode : {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128}) {
      for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16}) {
        const Case c = make_case(in, {256, 256}, x, fp8, mode);
        for (bool cw : {false, true}) {
          const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, cw);
          ASSERT_EQ(s.status, FP8KIT_OK) << c.name << ": " << s.error;
          EXPECT_EQ(s.underflow, 5u) << c.name << (cw ? " columnwise" : " rowwise");
          EXPECT_EQ(s.saturated, saturated) << c.name << (cw ? " columnwise" : " rowwise");
          EXPECT_EQ(qtest::float_bits(s.amax), 0x7fc00000u) << c.name;
          expect_matches_reference(c, cw);
        }
      }
    }
  }
}

// A finite x whose product with the scale overflows float32 still
// saturates; its square overflows the float32 norm_sq to inf.
TEST(CastStatistics, HugeFiniteValuesSaturateAndOverflowTheSums) {
  std::vector<float> x = {1.0f, 1e38f, -2.0f, 0.5f};
  const Case c = make_case(FP8KIT_FLOAT32, {2, 2}, x, FP8KIT_E4M3, FP8KIT_SCALING_PER_TENSOR, 8.0f);
  const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, false);
  ASSERT_EQ(s.status, FP8KIT_OK) << s.error;
  EXPECT_EQ(s.saturated, 1u);
  EXPECT_EQ(s.norm_sq, INFINITY);
  EXPECT_EQ(s.amax, 1e38f);
}

// ------------------------------------------------------- random, CPU --

// Normal values with zeros, tiny and large values and an inf mixed in (and
// a NaN when `nan`).
std::vector<float> mixed_values(size_t n, uint32_t seed, bool nan) {
  std::vector<float> x = qtest::random_values(n, 2.0f, seed, false, nan);
  const float sp[] = {0.0f, -0.0f, 1e-7f, -3e-6f, 1e-40f, 5000.0f, -70000.0f, INFINITY};
  for (size_t k = 0; k < 8 && n > 8; ++k) x[(k * 7919u + seed) % n] = sp[k];
  return x;
}

const std::vector<Shape> kShapes = {{3, 5, 130}, {300, 260}, {129, 1}, {1, 257}, {7}, {},
                                    {2, 0, 4}};

TEST(CastStatistics, RandomMatchesReference) {
  uint32_t seed = 11;
  for (const Shape& shape : kShapes) {
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (fp8kit_dtype fp8 : kFormats) {
        for (fp8kit_scaling_mode mode : kModes) {
          const std::vector<float> x =
              mixed_values(size_t(qtest::numel(shape)), seed, seed % 3 == 0);
          // Per tensor: values beyond 4 sigma clip.
          const float scale = float(qtest::fp8_max_value(fp8)) / 8.0f;
          const Case c = make_case(in, shape, x, fp8, mode, scale);
          ++seed;
          for (bool cw : {false, true}) expect_matches_reference(c, cw);
        }
      }
    }
  }
}

// What the statistics are for: E4M3 keeps more bits than E5M2; both
// scalings of E4M3 lose about 2^-5 relative.
TEST(CastStatistics, RelativeErrorsOrderAsExpected) {
  std::vector<float> x = qtest::random_values(256 * 256, 1.0f, 5, false);
  for (size_t i = 0; i < x.size(); i += 1000) x[i] *= 300.0f;  // outliers
  auto rel = [&](fp8kit_dtype fp8, fp8kit_scaling_mode mode) {
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float scale = float(qtest::fp8_max_value(fp8)) / amax;
    const Case c = make_case(FP8KIT_FLOAT32, {256, 256}, x, fp8, mode, scale);
    const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, false);
    EXPECT_EQ(s.status, FP8KIT_OK) << s.error;
    return std::sqrt(double(s.error_sq) / double(s.norm_sq));
  };
  const double e4m3 = rel(FP8KIT_E4M3, FP8KIT_SCALING_PER_TENSOR);
  const double e5m2 = rel(FP8KIT_E5M2, FP8KIT_SCALING_PER_TENSOR);
  const double block = rel(FP8KIT_E4M3, FP8KIT_SCALING_BLOCK_1X128);
  EXPECT_GT(e4m3, 0.0);
  EXPECT_LT(e4m3, 0x1p-4);  // 3 mantissa bits: about 2^-5 relative
  EXPECT_LT(e4m3, e5m2);
  EXPECT_GT(block, 0.0);
  EXPECT_LT(block, 0x1p-4);
}

TEST(CastStatistics, EmptyGivesZeros) {
  for (const Shape& shape : {Shape{0, 64}, Shape{3, 0}}) {
    const Case c = make_case(FP8KIT_BFLOAT16, shape, {}, FP8KIT_E4M3, FP8KIT_SCALING_BLOCK_1X128);
    const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, true);
    ASSERT_EQ(s.status, FP8KIT_OK) << s.error;
    EXPECT_EQ(qtest::float_bits(s.amax), 0u);
    EXPECT_EQ(s.underflow, 0u);
    EXPECT_EQ(s.saturated, 0u);
    EXPECT_EQ(qtest::float_bits(s.error_sq), 0u);
    EXPECT_EQ(qtest::float_bits(s.norm_sq), 0u);
  }
}

// ------------------------------------------------------------ errors --

class CastStatisticsErrors : public ::testing::Test {
 protected:
  float in_buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint8_t q_buf[8] = {};
  float scale_inv = 1.0f, amax = 0, error_sq = 0, norm_sq = 0;
  unsigned int underflow = 0, saturated = 0;
  fp8kit_tensor in{}, q{};
  fp8kit_cast_statistics out{};
  int from_columnwise = 0;

  void SetUp() override {
    in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {2, 4}, in_buf);
    q = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {2, 4}, q_buf);
    q.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    q.scale_inv = &scale_inv;
    out = {&amax, &underflow, &saturated, &error_sq, &norm_sq, nullptr};
  }
  // The call fails with `status` and a message holding every one of `parts`.
  void expect_error(fp8kit_status status, const std::vector<std::string>& parts,
                    const fp8kit_cast_statistics* o = nullptr, bool null_out = false) {
    const fp8kit_status got =
        fp8kit_cast_statistics_of(&in, &q, from_columnwise, null_out ? nullptr : (o ? o : &out),
                                  nullptr);
    EXPECT_EQ(got, status);
    const std::string msg = fp8kit_last_error();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    SetUp();
    from_columnwise = 0;
  }
};

TEST_F(CastStatisticsErrors, EachArgument) {
  ASSERT_EQ(fp8kit_cast_statistics_of(&in, &q, 0, &out, nullptr), FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(fp8kit_cast_statistics_of(nullptr, &q, 0, &out, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("input descriptor is NULL"), std::string::npos);
  EXPECT_EQ(fp8kit_cast_statistics_of(&in, nullptr, 0, &out, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("quantized descriptor is NULL"),
            std::string::npos);
  expect_error(FP8KIT_INVALID_ARGUMENT, {"out is NULL"}, nullptr, true);
  for (int field = 0; field < 5; ++field) {
    fp8kit_cast_statistics o = out;
    const char* names[] = {"out->amax", "out->underflow", "out->saturated", "out->error_sq",
                           "out->norm_sq"};
    if (field == 0) o.amax = nullptr;
    if (field == 1) o.underflow = nullptr;
    if (field == 2) o.saturated = nullptr;
    if (field == 3) o.error_sq = nullptr;
    if (field == 4) o.norm_sq = nullptr;
    expect_error(FP8KIT_INVALID_ARGUMENT, {names[field], "is NULL"}, &o);
  }
  in.dtype = FP8KIT_E5M2;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"input has dtype e5m2", "float32, bfloat16 or float16"});
  q.dtype = FP8KIT_BFLOAT16;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantized has dtype bfloat16", "e4m3 or e5m2"});
  q.shape[1] = 3;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"input has shape [2, 4] but quantized has shape [2, 3]"});
  q.scaling_mode = FP8KIT_SCALING_NONE;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"FP8KIT_SCALING_NONE", "FP8KIT_SCALING_PER_TENSOR"});
  q.scale_inv = nullptr;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantized->scale_inv is NULL"});
  q.data = nullptr;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantized->data (rowwise) is NULL", "from_columnwise"});
  from_columnwise = 1;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantized->columnwise_data is NULL"});
  q.scaling_mode = FP8KIT_SCALING_BLOCK_1X128;
  q.scale_inv = nullptr;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantized->block_scale_inv is NULL"});
  q.scaling_mode = FP8KIT_SCALING_BLOCK_128X128;
  q.columnwise_data = q_buf;
  from_columnwise = 1;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantized->columnwise_block_scale_inv is NULL"});
}

TEST_F(CastStatisticsErrors, CountsAre32Bit) {
  in.shape[0] = in.shape[1] = q.shape[0] = q.shape[1] = 65536;  // 2^32 elements, never read
  expect_error(FP8KIT_INVALID_ARGUMENT, {"4294967296 elements", "32-bit"});
}

TEST_F(CastStatisticsErrors, DeviceMismatchOrMissingCuda) {
  q.device_type = FP8KIT_DEVICE_CUDA;
  const fp8kit_status got = fp8kit_cast_statistics_of(&in, &q, 0, &out, nullptr);
  EXPECT_NE(got, FP8KIT_OK);
  const std::string msg = fp8kit_last_error();
  if (!fp8kit_built_with_cuda()) {
    EXPECT_EQ(got, FP8KIT_UNSUPPORTED);
    EXPECT_NE(msg.find("no CUDA support"), std::string::npos) << msg;
  } else if (qtest::gpu_available()) {
    EXPECT_EQ(got, FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(msg.find("input and quantized are on different devices"), std::string::npos) << msg;
  }
}

// -------------------------------------------------------------- CUDA --

void expect_gpu_matches_cpu(const Case& c, bool cw, bool in_child_graph = false) {
  const std::string what = c.name + (cw ? " columnwise" : " rowwise") +
                           (in_child_graph ? " in a child graph" : "");
  const Stats cpu = run_stats(FP8KIT_DEVICE_CPU, c, cw);
  const Stats gpu = run_stats(FP8KIT_DEVICE_CUDA, c, cw, in_child_graph);
  ASSERT_EQ(cpu.status, FP8KIT_OK) << what << ": " << cpu.error;
  ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
  EXPECT_EQ(qtest::float_bits(gpu.amax), qtest::float_bits(cpu.amax)) << what;
  EXPECT_EQ(gpu.underflow, cpu.underflow) << what;
  EXPECT_EQ(gpu.saturated, cpu.saturated) << what;
  expect_sum(gpu.error_sq, double(cpu.error_sq), 1e-5, what + ": error_sq");  // the header's bound
  expect_sum(gpu.norm_sq, double(cpu.norm_sq), 1e-5, what + ": norm_sq");
}

TEST(CastStatisticsGpu, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  // Tile edges (not multiples of 32), one row / one column (the columnwise
  // copy in the input's order), more work than the grid (2048 x 2304 = 4.7M
  // elements over at most 128 blocks), rank 0, empty.
  std::vector<Shape> shapes = kShapes;
  shapes.push_back({2048, 2304});
  shapes.push_back({5000, 1});
  shapes.push_back({33, 65});
  uint32_t seed = 70;
  for (const Shape& shape : shapes) {
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (fp8kit_dtype fp8 : kFormats) {
        for (fp8kit_scaling_mode mode : kModes) {
          const std::vector<float> x =
              mixed_values(size_t(qtest::numel(shape)), seed, seed % 4 == 0);
          const Case c =
              make_case(in, shape, x, fp8, mode, float(qtest::fp8_max_value(fp8)) / 8.0f);
          ++seed;
          for (bool cw : {false, true}) expect_gpu_matches_cpu(c, cw);
        }
      }
    }
  }
}

TEST(CastStatisticsGpu, CraftedBlockCountsAndNaN) {
  QTEST_SKIP_WITHOUT_GPU();
  for (fp8kit_dtype fp8 : kFormats) {
    const float max = float(qtest::fp8_max_value(fp8)), sub = min_subnormal(fp8);
    std::vector<float> x = qtest::random_values(384 * 320, 1.0f, 3, false);
    for (size_t i = 0; i < x.size(); i += 101) x[i] = sub / 4;    // underflow
    for (size_t i = 50; i < x.size(); i += 997) x[i] = 1e4f * max;  // clipped per tensor
    x[12345] = NAN;
    for (fp8kit_scaling_mode mode : kModes) {
      const Case c = make_case(FP8KIT_BFLOAT16, {384, 320}, x, fp8, mode, 1.0f);
      for (bool cw : {false, true}) expect_gpu_matches_cpu(c, cw);
    }
  }
}

// XLA records a custom call into a command buffer by capturing it into a
// graph that it nests into the step's graph: the op must allocate nothing
// on the stream (its scratch is the caller's workspace), or CUDA refuses
// the nesting.
TEST(CastStatisticsGpu, RunsInsideANestedCudaGraph) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<float> x = mixed_values(size_t(300 * 260), 91, true);
  for (fp8kit_scaling_mode mode : kModes) {
    const Case c = make_case(FP8KIT_BFLOAT16, {300, 260}, x, FP8KIT_E4M3, mode, 28.0f);
    for (bool cw : {false, true}) expect_gpu_matches_cpu(c, cw, /*in_child_graph=*/true);
  }
}

TEST(CastStatisticsGpu, RefusesAMissingWorkspace) {
  QTEST_SKIP_WITHOUT_GPU();
  qtest::Buffer in(FP8KIT_DEVICE_CUDA, 32), q(FP8KIT_DEVICE_CUDA, 8), scale_inv(FP8KIT_DEVICE_CUDA, 4),
      outs(FP8KIT_DEVICE_CUDA, 20);
  scale_inv.set_float(1.0f);
  const fp8kit_tensor ti = qtest::make_tensor(FP8KIT_DEVICE_CUDA, FP8KIT_FLOAT32, {2, 4}, in.ptr());
  fp8kit_tensor tq = qtest::make_tensor(FP8KIT_DEVICE_CUDA, FP8KIT_E4M3, {2, 4}, q.ptr());
  tq.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  tq.scale_inv = scale_inv.fptr();
  float* o = outs.fptr();
  const fp8kit_cast_statistics out{o, reinterpret_cast<unsigned int*>(o + 1),
                                   reinterpret_cast<unsigned int*>(o + 2), o + 3, o + 4, nullptr};
  EXPECT_EQ(fp8kit_cast_statistics_of(&ti, &tq, 0, &out, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("out->workspace is NULL"), std::string::npos)
      << fp8kit_last_error();
}

}  // namespace
