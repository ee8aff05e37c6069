// fp8kit_cast_statistics_of_rows: a grouped per-tensor copy (each group's
// rows quantized with its own scale) read in one call with each row's
// scale_inv equals the merge of the groups read one by one with
// fp8kit_cast_statistics_of (amax the largest, counts added, sums added up
// to their float32 rounding); a copy with one scale for every row equals
// fp8kit_cast_statistics_of exactly; on a GPU, CUDA equals the CPU (amax and
// counts bit for bit, sums within the header's 1e-5); bad row scales are
// refused by name.
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
using stattest::make_case;
using stattest::run_stats;
using stattest::Shape;
using stattest::Stats;

// Groups of rows of a [rows, cols] tensor, each cast with its own scale.
struct Grouped {
  fp8kit_dtype in_dtype;
  std::vector<Case> groups;  // each group's rows as a tensor of their own
  std::vector<uint8_t> input, data;
  std::vector<float> row_scale_inv;
  int64_t rows = 0, cols = 0;
};

// cols 136: 17 vectors of 8, the CUDA kernel's vector path; 130: its
// element-by-element path.
Grouped make_grouped(fp8kit_dtype in_dtype, fp8kit_dtype fp8, const std::vector<int64_t>& sizes,
                     uint32_t seed, int64_t cols = 136) {
  Grouped g;
  g.in_dtype = in_dtype;
  g.cols = cols;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> x =
        qtest::random_values(size_t(sizes[i] * cols), 3.0f, seed + uint32_t(i), false, false);
    if (!x.empty()) x[0] = (i % 2 == 0) ? 1e-12f : 900.0f;  // underflows / sets a large amax
    // Scales that differ by group: 2^(i - 2) times the format's max over 8.
    const float scale = float(qtest::fp8_max_value(fp8)) / 8.0f * std::ldexp(1.0f, int(i) - 2);
    Case c = make_case(in_dtype, {sizes[i], cols}, x, fp8, FP8KIT_SCALING_PER_TENSOR, scale);
    g.input.insert(g.input.end(), c.input.begin(), c.input.end());
    g.data.insert(g.data.end(), c.data.begin(), c.data.end());
    g.row_scale_inv.insert(g.row_scale_inv.end(), size_t(sizes[i]), c.scale_inv);
    g.rows += sizes[i];
    g.groups.push_back(std::move(c));
  }
  return g;
}

// fp8kit_cast_statistics_of_rows on `dev` over the whole grouped tensor.
Stats run_rows(fp8kit_device_type dev, const Grouped& g, int64_t scale_count = -1,
               fp8kit_dtype scale_dtype = FP8KIT_FLOAT32,
               fp8kit_scaling_mode mode = FP8KIT_SCALING_PER_TENSOR, bool null_scales = false) {
  using qtest::Buffer;
  const int64_t n_scales = scale_count < 0 ? g.rows : scale_count;
  Buffer in(dev, g.input.size()), data(dev, g.data.size()),
      scales(dev, size_t(std::max<int64_t>(n_scales, g.rows)) * 4);
  in.upload(g.input.data(), g.input.size());
  data.upload(g.data.data(), g.data.size());
  scales.upload(g.row_scale_inv.data(), g.row_scale_inv.size() * 4);
  const fp8kit_tensor ti = qtest::make_tensor(dev, g.in_dtype, {g.rows, g.cols}, in.ptr());
  fp8kit_tensor tq = qtest::make_tensor(dev, g.groups[0].fp8, {g.rows, g.cols}, data.ptr());
  tq.scaling_mode = mode;
  const fp8kit_tensor ts = qtest::make_tensor(dev, scale_dtype, {n_scales}, scales.ptr());
  stattest::Outputs outputs(dev);
  return outputs.read(fp8kit_cast_statistics_of_rows(&ti, &tq, null_scales ? nullptr : &ts,
                                                     &outputs.out, nullptr));
}

const std::vector<int64_t> kSizes = {5, 0, 37, 16, 1};

TEST(CastStatisticsRows, EqualsTheGroupsMerged) {
  uint32_t seed = 500;
  for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16}) {
    for (fp8kit_dtype fp8 : stattest::kFormats) {
      const Grouped g = make_grouped(in, fp8, kSizes, seed += 10);
      float amax = 0.0f;
      unsigned int underflow = 0, saturated = 0;
      double error_sq = 0.0, norm_sq = 0.0;
      for (const Case& c : g.groups) {
        const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, false);
        ASSERT_EQ(s.status, FP8KIT_OK) << s.error;
        amax = std::max(amax, s.amax);
        underflow += s.underflow;
        saturated += s.saturated;
        error_sq += s.error_sq;
        norm_sq += s.norm_sq;
      }
      const Stats rows = run_rows(FP8KIT_DEVICE_CPU, g);
      ASSERT_EQ(rows.status, FP8KIT_OK) << rows.error;
      EXPECT_EQ(rows.amax, amax);
      EXPECT_EQ(rows.underflow, underflow);
      EXPECT_GT(rows.underflow, 0u);
      EXPECT_EQ(rows.saturated, saturated);
      stattest::expect_sum(rows.error_sq, error_sq, 1e-6, "error_sq");
      stattest::expect_sum(rows.norm_sq, norm_sq, 1e-6, "norm_sq");
    }
  }
}

TEST(CastStatisticsRows, OneScaleForEveryRowIsTheTensorsStatistics) {
  const Grouped g = make_grouped(FP8KIT_FLOAT32, FP8KIT_E4M3, {40}, 77);
  const Stats whole = run_stats(FP8KIT_DEVICE_CPU, g.groups[0], false);
  const Stats rows = run_rows(FP8KIT_DEVICE_CPU, g);
  ASSERT_EQ(rows.status, FP8KIT_OK) << rows.error;
  EXPECT_EQ(qtest::float_bits(rows.amax), qtest::float_bits(whole.amax));
  EXPECT_EQ(rows.underflow, whole.underflow);
  EXPECT_EQ(rows.saturated, whole.saturated);
  EXPECT_EQ(qtest::float_bits(rows.error_sq), qtest::float_bits(whole.error_sq));
  EXPECT_EQ(qtest::float_bits(rows.norm_sq), qtest::float_bits(whole.norm_sq));
}

TEST(CastStatisticsRows, BadRowScalesAreRefusedByName) {
  const Grouped g = make_grouped(FP8KIT_FLOAT32, FP8KIT_E4M3, {4, 3}, 9);
  const struct {
    Stats s;
    const char* says;
  } cases[] = {
      {run_rows(FP8KIT_DEVICE_CPU, g, -1, FP8KIT_FLOAT32, FP8KIT_SCALING_PER_TENSOR, true),
       "row_scale_inv"},
      {run_rows(FP8KIT_DEVICE_CPU, g, 6), "one scale_inv per row"},
      {run_rows(FP8KIT_DEVICE_CPU, g, -1, FP8KIT_BFLOAT16), "FP8KIT_FLOAT32"},
      {run_rows(FP8KIT_DEVICE_CPU, g, -1, FP8KIT_FLOAT32, FP8KIT_SCALING_BLOCK_1X128),
       "FP8KIT_SCALING_PER_TENSOR"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.s.status, FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(c.s.error.find(c.says), std::string::npos) << c.s.error;
  }
}

TEST(CastStatisticsRowsGpu, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 900;
  // Many rows (more work than the grid), and rows both a multiple of 8
  // long and not (the vector and the element-by-element paths).
  for (const std::vector<int64_t>& sizes :
       {kSizes, std::vector<int64_t>{3000, 0, 4100, 700}}) {
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (int64_t cols : {136, 130}) {
      const Grouped g = make_grouped(in, FP8KIT_E4M3, sizes, seed += 10, cols);
      const Stats cpu = run_rows(FP8KIT_DEVICE_CPU, g);
      const Stats gpu = run_rows(FP8KIT_DEVICE_CUDA, g);
      ASSERT_EQ(cpu.status, FP8KIT_OK) << cpu.error;
      ASSERT_EQ(gpu.status, FP8KIT_OK) << gpu.error;
      EXPECT_EQ(qtest::float_bits(gpu.amax), qtest::float_bits(cpu.amax));
      EXPECT_EQ(gpu.underflow, cpu.underflow);
      EXPECT_EQ(gpu.saturated, cpu.saturated);
      stattest::expect_sum(gpu.error_sq, double(cpu.error_sq), 1e-5, "error_sq");
      stattest::expect_sum(gpu.norm_sq, double(cpu.norm_sq), 1e-5, "norm_sq");
      }
    }
  }
}

}  // namespace
