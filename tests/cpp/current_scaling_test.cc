// Current scaling: fp8kit_compute_scale's rules (epsilon, zero and
// non-finite amax, power-of-two rounding, overflow clamp) against values
// computed here in double, fp8kit_quantize_current_scaling end to end
// against the reference, its column sums against a float32 reference in
// the documented order and a float64 sum, errors, and CUDA == CPU.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

using qtest::QuantResult;
using qtest::QuantSpec;

// The scale the rules give, computed independently: float(double quotient)
// is the correctly rounded float32 quotient.
float expected_scale(float amax, fp8kit_dtype fmt, float eps, bool power_2_scale) {
  if (!std::isfinite(amax) || !(amax > 0.0f)) return 1.0f;
  const double denom = std::max(double(amax), double(eps));
  double s = double(float(qtest::fp8_max_value(fmt) / denom));
  if (s > double(FLT_MAX)) s = FLT_MAX;
  if (power_2_scale) {
    // Down to a power of two, not below the one that keeps fp8_max *
    // scale_inv <= FLT_MAX.
    s = std::exp2(std::floor(std::log2(s)));
    if (qtest::fp8_max_value(fmt) / s > double(FLT_MAX)) s *= 2.0;
  }
  return float(s);
}

struct ScaleOut {
  fp8kit_status status;
  float scale, scale_inv;
};

ScaleOut compute_scale(fp8kit_device_type dev, float amax, fp8kit_dtype fmt,
                       fp8kit_current_scaling_config config) {
  qtest::Buffer a(dev, 4), s(dev, 4), si(dev, 4);
  a.set_float(amax);
  ScaleOut r;
  r.status = fp8kit_compute_scale(a.fptr(), s.fptr(), si.fptr(), fmt, &config, dev, 0, nullptr);
  r.scale = r.status == FP8KIT_OK ? s.get_float() : NAN;
  r.scale_inv = r.status == FP8KIT_OK ? si.get_float() : NAN;
  return r;
}

const float kAmaxes[] = {0.0f,     -0.0f,   1.0f,   3.0f,    448.0f, 1e-3f,   7.77e4f,  1e-30f,
                         1e-40f,   1e-45f,  FLT_MAX, INFINITY, -INFINITY, NAN, 0.1f, -2.0f};

TEST(CurrentScaling, ComputeScaleRules) {
  for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
    for (float eps : {0.0f, 1e-12f, 0.5f}) {
      for (int power_2_scale : {0, 1}) {
        for (float amax : kAmaxes) {
          const ScaleOut r = compute_scale(FP8KIT_DEVICE_CPU, amax, fmt, {eps, power_2_scale});
          ASSERT_EQ(r.status, FP8KIT_OK) << fp8kit_last_error();
          const float want = expected_scale(amax, fmt, eps, power_2_scale != 0);
          EXPECT_EQ(r.scale, want) << fp8kit_dtype_name(fmt) << " amax " << amax << " eps " << eps
                                   << " power_2_scale " << power_2_scale;
          EXPECT_EQ(r.scale_inv, float(1.0 / double(want)));
          EXPECT_TRUE(std::isfinite(r.scale_inv) && r.scale_inv > 0.0f);
        }
      }
    }
  }
}

TEST(CurrentScaling, SpecificScales) {
  const fp8kit_current_scaling_config plain{0.0f, 0}, power_2_scale{0.0f, 1};
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, 2.0f, FP8KIT_E4M3, plain).scale, 224.0f);
  // 448 / 3 = 149.3 -> 128
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, 3.0f, FP8KIT_E4M3, power_2_scale).scale, 128.0f);
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, 0.0f, FP8KIT_E4M3, plain).scale, 1.0f);
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, NAN, FP8KIT_E5M2, plain).scale, 1.0f);
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, INFINITY, FP8KIT_E5M2, plain).scale, 1.0f);
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, 1e-44f, FP8KIT_E4M3, plain).scale, FLT_MAX);
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, 1e-44f, FP8KIT_E4M3, power_2_scale).scale, 0x1p127f);
  // Epsilon bounds the scale from above.
  EXPECT_EQ(compute_scale(FP8KIT_DEVICE_CPU, 1e-6f, FP8KIT_E4M3, {0.5f, 0}).scale, 896.0f);
}

TEST(CurrentScaling, QuantizeUsesTheComputedScale) {
  uint32_t seed = 40;
  for (fp8kit_dtype in_dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
    for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
      for (int power_2_scale : {0, 1}) {
        QuantSpec s;
        s.in_dtype = in_dtype;
        s.shape = {33, 65};
        s.fp8 = fmt;
        s.current = true;
        s.config = {0.0f, power_2_scale};
        const std::vector<uint8_t> input = qtest::encode_input(
            qtest::random_values(size_t(qtest::numel(s.shape)), 3.0f, seed++, false), in_dtype);
        const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
        ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
        const float amax = qtest::ref_amax(input, in_dtype, size_t(qtest::numel(s.shape)));
        EXPECT_EQ(r.amax, amax);
        EXPECT_EQ(r.scale, expected_scale(amax, fmt, 0.0f, power_2_scale != 0));
        EXPECT_EQ(r.scale_inv, float(1.0 / double(r.scale)));
        qtest::expect_matches_reference(s, input, r, r.scale);
        // The largest element lands on (or, with a power-of-two scale, below)
        // the format's max.
        int max_code = 0;
        for (uint8_t b : r.data) max_code = std::max(max_code, int(b & 0x7f));
        EXPECT_LE(qtest::decode_fp8(uint8_t(max_code), fmt), qtest::fp8_max_value(fmt));
        if (!power_2_scale) {
          EXPECT_EQ(qtest::decode_fp8(uint8_t(max_code), fmt), qtest::fp8_max_value(fmt));
        }
      }
    }
  }
}

TEST(CurrentScaling, ZeroAndNonFiniteTensorsGetScaleOne) {
  for (float special : {0.0f, NAN, INFINITY}) {
    QuantSpec s;
    s.shape = {4, 4};
    s.current = true;
    std::vector<float> x(16, 0.0f);
    x[5] = special;
    const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, s.in_dtype));
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.scale, 1.0f) << special;
    EXPECT_EQ(r.scale_inv, 1.0f);
  }
  QuantSpec s;
  s.shape = {0, 3};
  s.current = true;
  const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, {});
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  EXPECT_EQ(r.amax, 0.0f);
  EXPECT_EQ(r.scale, 1.0f);
}

TEST(CurrentScaling, ColumnSumsInTheDocumentedOrder) {
  // Tile and group borders (rows 1000 = 7 full tiles + 104), odd columns,
  // every input and sums dtype, a NaN in one case.
  const std::vector<std::vector<int64_t>> shapes = {{1000, 77}, {2, 3, 129}, {130, 2}};
  uint32_t seed = 50;
  for (const auto& shape : shapes) {
    for (fp8kit_dtype in_dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (fp8kit_dtype sums_dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        const auto [rows, cols] = qtest::flat2d(shape);
        const bool nan = seed % 4 == 0;
        const std::vector<uint8_t> input = qtest::encode_input(
            qtest::random_values(size_t(rows * cols), 3.0f, seed++, false, nan), in_dtype);
        QuantSpec s;
        s.in_dtype = in_dtype;
        s.shape = shape;
        s.current = true;
        s.with_sums = true;
        s.sums_dtype = sums_dtype;
        s.rowwise = seed % 2 == 0;
        const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
        ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
        const std::string what = std::string(fp8kit_dtype_name(in_dtype)) + " -> " +
                                 fp8kit_dtype_name(sums_dtype) + " rows " +
                                 std::to_string(rows);
        EXPECT_EQ(r.sums, qtest::ref_column_sums(input, in_dtype, rows, cols, sums_dtype)) << what;
        EXPECT_EQ(r.sums_counters, std::vector<uint8_t>(r.sums_counters.size(), 0)) << what;
        // The quantization is the one without sums.
        QuantSpec plain = s;
        plain.with_sums = false;
        const QuantResult p = qtest::run_quantize(FP8KIT_DEVICE_CPU, plain, input);
        EXPECT_EQ(r.data, p.data) << what;
        EXPECT_EQ(r.columnwise, p.columnwise) << what;
        EXPECT_EQ(qtest::float_bits(r.scale), qtest::float_bits(p.scale)) << what;
        // And the order's sum is a sum: within float32 rounding of float64.
        if (nan || sums_dtype != FP8KIT_FLOAT32) continue;
        for (int64_t c = 0; c < cols; ++c) {
          double want = 0.0, abs_sum = 0.0;
          for (int64_t row = 0; row < rows; ++row) {
            const double v = qtest::input_value(input, in_dtype, size_t(row * cols + c));
            want += v;
            abs_sum += std::fabs(v);
          }
          ASSERT_NEAR(qtest::input_value(r.sums, FP8KIT_FLOAT32, size_t(c)), want,
                      double(rows) * std::ldexp(1.0, -24) * abs_sum + 1e-30)
              << what << " column " << c;
        }
      }
    }
  }
}

TEST(CurrentScaling, ColumnSumsErrors) {
  auto expect = [](std::vector<int64_t> shape, bool columnwise, fp8kit_dtype sums_dtype,
                   bool workspace, const char* fragment) {
    const auto [rows, cols] = qtest::flat2d(shape);
    std::vector<float> x(size_t(rows * cols), 1.0f), partials(size_t(rows * cols) + 1),
        sums(static_cast<size_t>(cols));
    std::vector<uint8_t> q(x.size()), qt(x.size());
    std::vector<unsigned> counters(size_t(cols), 0u);
    float scale = 0, scale_inv = 0, amax = 0;
    fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, x.data());
    fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, q.data());
    out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    out.columnwise_data = columnwise ? qt.data() : nullptr;
    out.scale = &scale;
    out.scale_inv = &scale_inv;
    out.amax = &amax;
    const fp8kit_column_sums cs{sums.data(), sums_dtype, workspace ? partials.data() : nullptr,
                                counters.data()};
    const fp8kit_current_scaling_config config{0.0f, 0};
    EXPECT_EQ(fp8kit_quantize_current_scaling(&in, &out, &config, &cs, nullptr),
              FP8KIT_INVALID_ARGUMENT) << fragment;
    EXPECT_NE(std::string(fp8kit_last_error()).find(fragment), std::string::npos)
        << fp8kit_last_error();
  };
  expect({8, 8}, false, FP8KIT_FLOAT32, true, "needs output->columnwise_data");
  expect({1, 64}, true, FP8KIT_FLOAT32, true, "rows > 1 and cols > 1");
  expect({64, 1}, true, FP8KIT_FLOAT32, true, "rows > 1 and cols > 1");
  expect({8, 8}, true, FP8KIT_E4M3, true, "sums.dtype is e4m3");
  expect({8, 8}, true, FP8KIT_FLOAT32, false, "NULL partials or counters");
}

TEST(CurrentScaling, Errors) {
  uint16_t in_buf[8] = {};
  uint8_t out_buf[8] = {};
  float scale = 0, scale_inv = 0, amax = 0;
  fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_BFLOAT16, {8}, in_buf);
  fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {8}, out_buf);
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  out.scale = &scale;
  out.scale_inv = &scale_inv;
  out.amax = &amax;
  fp8kit_current_scaling_config config{0.0f, 0};
  auto expect = [&](const fp8kit_current_scaling_config* c, const char* fragment) {
    EXPECT_EQ(fp8kit_quantize_current_scaling(&in, &out, c, nullptr, nullptr),
              FP8KIT_INVALID_ARGUMENT);
    const std::string msg = fp8kit_last_error();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find("quantize_current_scaling"), std::string::npos) << msg;
  };
  ASSERT_EQ(fp8kit_quantize_current_scaling(&in, &out, &config, nullptr, nullptr), FP8KIT_OK);
  expect(nullptr, "config is NULL");
  config.amax_epsilon = -1.0f;
  expect(&config, "amax_epsilon");
  config.amax_epsilon = NAN;
  expect(&config, "amax_epsilon");
  config.amax_epsilon = 0.0f;
  out.amax = nullptr;
  expect(&config, "output->amax is NULL");
  out.amax = &amax;
  out.scale_inv = nullptr;
  expect(&config, "output->scale_inv is NULL");
  out.scale_inv = &scale_inv;
  out.scale = nullptr;
  expect(&config, "output->scale is NULL");

  EXPECT_EQ(fp8kit_compute_scale(&amax, &scale, &scale_inv, FP8KIT_BFLOAT16, &config,
                                 FP8KIT_DEVICE_CPU, 0, nullptr),
            FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("fp8_dtype"), std::string::npos);
  EXPECT_EQ(fp8kit_compute_scale(nullptr, &scale, &scale_inv, FP8KIT_E4M3, &config,
                                 FP8KIT_DEVICE_CPU, 0, nullptr),
            FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("amax is NULL"), std::string::npos);
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaQuantCurrentScaling, ComputeScaleMatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
    for (float eps : {0.0f, 0.5f}) {
      for (int power_2_scale : {0, 1}) {
        for (float amax : kAmaxes) {
          const ScaleOut c = compute_scale(FP8KIT_DEVICE_CPU, amax, fmt, {eps, power_2_scale});
          const ScaleOut g = compute_scale(FP8KIT_DEVICE_CUDA, amax, fmt, {eps, power_2_scale});
          ASSERT_EQ(g.status, FP8KIT_OK) << fp8kit_last_error();
          EXPECT_EQ(qtest::float_bits(c.scale), qtest::float_bits(g.scale)) << amax;
          EXPECT_EQ(qtest::float_bits(c.scale_inv), qtest::float_bits(g.scale_inv)) << amax;
        }
      }
    }
  }
}

TEST(CudaQuantCurrentScaling, QuantizeMatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int64_t>> shapes = {{},          {1},        {5, 7},     {128, 256},
                                                    {1000, 1000}, {257, 33}, {1, 4097},  {3, 640, 384},
                                                    {0, 16}};
  uint32_t seed = 400;
  for (const auto& shape : shapes) {
    const size_t n = size_t(qtest::numel(shape));
    const std::vector<float> x = qtest::random_values(n, 7.0f, seed++, false);
    for (fp8kit_dtype in_dtype : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32}) {
      const std::vector<uint8_t> input = qtest::encode_input(x, in_dtype);
      for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
        for (int power_2_scale : {0, 1}) {
          QuantSpec s;
          s.in_dtype = in_dtype;
          s.shape = shape;
          s.fp8 = fmt;
          s.current = true;
          s.config = {power_2_scale ? 1e-3f : 0.0f, power_2_scale};
          s.rowwise = (seed + power_2_scale) % 3 != 0;  // vary the layouts too
          const auto [rows, cols] = qtest::flat2d(shape);
          s.with_sums = rows > 1 && cols > 1 && (seed + power_2_scale) % 2 == 0;
          s.sums_dtype = power_2_scale ? FP8KIT_BFLOAT16 : FP8KIT_FLOAT32;
          const QuantResult c = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
          const QuantResult g = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
          qtest::expect_same_result(c, g,
                                    std::string(fp8kit_dtype_name(in_dtype)) + "->" +
                                        fp8kit_dtype_name(fmt) + " n=" + std::to_string(n) +
                                        " power_2_scale=" + std::to_string(power_2_scale));
        }
      }
    }
  }
}

TEST(CudaQuantCurrentScaling, NaNInputGivesScaleOne) {
  QTEST_SKIP_WITHOUT_GPU();
  std::vector<float> x = qtest::random_values(100000, 2.0f, 9, false);
  x[77777] = NAN;
  QuantSpec s;
  s.shape = {100, 1000};
  s.current = true;
  s.with_sums = true;  // a NaN column sum too
  const std::vector<uint8_t> input = qtest::encode_input(x, s.in_dtype);
  const QuantResult g = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
  ASSERT_EQ(g.status, FP8KIT_OK) << g.error;
  EXPECT_TRUE(std::isnan(g.amax));
  EXPECT_EQ(g.scale, 1.0f);
  qtest::expect_same_result(qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input), g, "NaN input");
}

#else

TEST(CudaQuantCurrentScaling, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
