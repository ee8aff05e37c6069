// The FP8 cast at the ends of the float32 range (fp8kit/quantize.h,
// fp8kit/block_scaling.h):
//   - saturation is for finite values: +-inf in the input becomes NaN in
//     E4M3 and keeps its inf in E5M2 (so an overflow upstream reaches a
//     GEMM's output, as it would in bf16), with a given, a current and a
//     block scale, while a finite value whose product with the scale
//     overflows float32 still saturates;
//   - a computed (current or block) scale keeps every dequantized value of
//     a finite input finite: fp8_max * scale_inv <= FLT_MAX, checked in
//     float64, also for blocks of values next to FLT_MAX;
// on the CPU against values derived here, and on a GPU, CUDA == CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
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
using qtest::QuantResult;
using qtest::QuantSpec;

const fp8kit_dtype kFormats[] = {FP8KIT_E4M3, FP8KIT_E5M2};
const fp8kit_scaling_mode kModes[] = {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128};

// The code an infinite input element gets (with a valid scale).
uint8_t inf_code(float x, fp8kit_dtype fmt) {
  if (fmt == FP8KIT_E4M3) return 0x7f;
  return x < 0 ? 0xfc : 0x7c;
}

// fp8kit_dequantize to float32 of a per-tensor copy (rowwise bytes).
std::vector<float> dequantize_per_tensor(const std::vector<uint8_t>& q, fp8kit_dtype fmt,
                                         const std::vector<int64_t>& shape, float scale_inv) {
  std::vector<float> out(q.size(), -1.0f);
  fp8kit_tensor ti =
      qtest::make_tensor(FP8KIT_DEVICE_CPU, fmt, shape, const_cast<uint8_t*>(q.data()));
  ti.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  ti.scale_inv = &scale_inv;
  fp8kit_tensor to = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, out.data());
  EXPECT_EQ(fp8kit_dequantize(&ti, &to, 0, nullptr), FP8KIT_OK) << fp8kit_last_error();
  return out;
}

// fp8kit_dequantize to float32 of one block-scaled copy, in the logical
// layout.
std::vector<float> dequantize_block(const Spec& s, const blocktest::Copy& c, bool columnwise) {
  std::vector<float> out(c.data.size(), -1.0f);
  fp8kit_tensor ti = qtest::make_tensor(FP8KIT_DEVICE_CPU, s.fp8, s.shape,
                                        columnwise ? nullptr : (void*)c.data.data());
  ti.scaling_mode = s.mode;
  ti.columnwise_data = columnwise ? (void*)c.data.data() : nullptr;
  std::vector<float> scales(c.scales.size() + 4);
  float* aligned = scales.data() + (4 - reinterpret_cast<uintptr_t>(scales.data()) % 16 / 4) % 4;
  std::copy(c.scales.begin(), c.scales.end(), aligned);
  (columnwise ? ti.columnwise_block_scale_inv : ti.block_scale_inv) = aligned;
  fp8kit_tensor to = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, s.shape, out.data());
  EXPECT_EQ(fp8kit_dequantize(&ti, &to, columnwise ? 1 : 0, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  return out;
}

// ------------------------------------------------------ non-finite input --

struct OverflowCase {
  float x, scale;
  fp8kit_dtype fmt;
  uint8_t code;
};

TEST(NonFiniteInput, InfIsNotSaturatedButFiniteOverflowIs) {
  const OverflowCase cases[] = {
      // A finite product past the max, and one past FLT_MAX: saturate.
      {500.0f, 1.0f, FP8KIT_E4M3, 0x7e},       {1e38f, 1e3f, FP8KIT_E4M3, 0x7e},
      {-FLT_MAX, 2.0f, FP8KIT_E4M3, 0xfe},     {1e38f, 1e3f, FP8KIT_E5M2, 0x7b},
      {-FLT_MAX, 2.0f, FP8KIT_E5M2, 0xfb},
      // An infinite input, whatever the scale: NaN (E4M3) or inf (E5M2).
      {INFINITY, 1.0f, FP8KIT_E4M3, 0x7f},     {-INFINITY, 1e-30f, FP8KIT_E4M3, 0x7f},
      {INFINITY, 1e-30f, FP8KIT_E5M2, 0x7c},   {-INFINITY, 1.0f, FP8KIT_E5M2, 0xfc},
      {NAN, 1.0f, FP8KIT_E5M2, 0x7f},
  };
  for (const OverflowCase& c : cases) {
    SCOPED_TRACE(std::string(fp8kit_dtype_name(c.fmt)) + " x=" + ::testing::PrintToString(c.x) +
                 " scale=" + ::testing::PrintToString(c.scale));
    EXPECT_EQ(qtest::ref_quantize(c.x, c.scale, c.fmt), c.code) << "test reference";
    QuantSpec s;
    s.in_dtype = FP8KIT_FLOAT32;
    s.shape = {1};
    s.fp8 = c.fmt;
    s.scale = c.scale;
    const QuantResult r =
        qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input({c.x}, FP8KIT_FLOAT32));
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.data[0], c.code);
    EXPECT_EQ(r.columnwise[0], c.code);
  }
}

// A [4, 64] tensor of normal values with +inf, -inf and (second pass) a NaN
// in it: every element as the reference quantizes it with `scale`, the
// non-finite ones non-finite after dequantization, the others finite.
void expect_visible(const QuantSpec& s, const std::vector<float>& x, const QuantResult& r,
                    float scale) {
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  const std::vector<uint8_t> input = qtest::encode_input(x, s.in_dtype);
  qtest::expect_matches_reference(s, input, r, scale);
  const std::vector<float> y = dequantize_per_tensor(r.data, s.fp8, s.shape, r.scale_inv);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(std::isfinite(y[i]), std::isfinite(x[i])) << "element " << i << ": " << x[i];
    if (std::isinf(x[i])) {
      EXPECT_EQ(r.data[i], inf_code(x[i], s.fp8)) << i;
    }
  }
}

std::vector<float> with_infs(bool nan) {
  std::vector<float> x = qtest::random_values(4 * 64, 2.0f, 5, false);
  x[10] = INFINITY;
  x[140] = -INFINITY;
  if (nan) x[200] = NAN;
  return x;
}

TEST(NonFiniteInput, DelayedScalingKeepsInfVisible) {
  for (fp8kit_dtype fmt : kFormats) {
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (bool nan : {false, true}) {
        QuantSpec s;
        s.in_dtype = in;
        s.shape = {4, 64};
        s.fp8 = fmt;
        s.scale = 37.0f;
        const std::vector<float> x = with_infs(nan);
        const QuantResult r =
            qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, in));
        SCOPED_TRACE(std::string(fp8kit_dtype_name(in)) + "->" + fp8kit_dtype_name(fmt));
        expect_visible(s, x, r, s.scale);
      }
    }
  }
}

// Current scaling: a non-finite amax gives scale 1, so the finite values
// are cast unscaled (none becomes NaN or is flushed by a scale of 0) and
// the inf stays non-finite.
TEST(NonFiniteInput, CurrentScalingKeepsInfVisible) {
  for (fp8kit_dtype fmt : kFormats) {
    for (int pow2 : {0, 1}) {
      for (bool nan : {false, true}) {
        QuantSpec s;
        s.in_dtype = FP8KIT_FLOAT32;
        s.shape = {4, 64};
        s.fp8 = fmt;
        s.current = true;
        s.config = {0.0f, pow2};
        const std::vector<float> x = with_infs(nan);
        const QuantResult r =
            qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, FP8KIT_FLOAT32));
        SCOPED_TRACE(std::string(fp8kit_dtype_name(fmt)) + (pow2 ? " pow2" : ""));
        EXPECT_EQ(r.scale, 1.0f);
        EXPECT_EQ(r.scale_inv, 1.0f);
        EXPECT_TRUE(nan ? std::isnan(r.amax) : r.amax == INFINITY);
        expect_visible(s, x, r, 1.0f);
      }
    }
  }
}

// Block scaling: the inf's own tile or block gets scale 1 (the model's
// rule), every other block its usual scale, and only the inf element
// dequantizes to a non-finite value.
TEST(NonFiniteInput, BlockScalingKeepsInfVisible) {
  std::vector<float> x = qtest::random_values(256 * 256, 3.0f, 8, false);
  x[size_t(3 * 256 + 7)] = INFINITY;
  x[size_t(200 * 256 + 130)] = -INFINITY;
  const std::vector<uint8_t> input = qtest::encode_input(x, FP8KIT_BFLOAT16);
  for (fp8kit_scaling_mode mode : kModes) {
    for (fp8kit_dtype fmt : kFormats) {
      Spec s;
      s.shape = {256, 256};
      s.mode = mode;
      s.fp8 = fmt;
      s.config.power_2_scale = 1;
      const std::string what = blocktest::spec_name(s);
      const blocktest::Result r = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
      ASSERT_EQ(r.status, FP8KIT_OK) << what << ": " << r.error;
      for (bool columnwise : {false, true}) {
        const blocktest::Copy& c = columnwise ? r.columnwise : r.rowwise;
        blocktest::expect_same_copy(c, blocktest::model_copy(s, input, columnwise), what);
        const std::vector<float> y = dequantize_block(s, c, columnwise);
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(std::isfinite(y[i]), std::isfinite(x[i]))
              << what << (columnwise ? " columnwise" : " rowwise") << " element " << i;
        }
      }
      EXPECT_EQ(r.rowwise.data[size_t(3 * 256 + 7)], inf_code(INFINITY, fmt)) << what;
      EXPECT_EQ(r.rowwise.data[size_t(200 * 256 + 130)], inf_code(-INFINITY, fmt)) << what;
    }
  }
}

// ------------------------------------------------------------ the range --

float fp8_max(fp8kit_dtype fmt) { return float(qtest::fp8_max_value(fmt)); }

// The largest dequantized value a scale allows, fp8_max * scale_inv, in
// float64 (exact) and as the float32 multiply fp8kit_dequantize does.
void expect_dequantized_max_finite(float scale_inv, fp8kit_dtype fmt, const std::string& what) {
  EXPECT_LE(double(fp8_max(fmt)) * double(scale_inv), double(FLT_MAX)) << what;
  EXPECT_TRUE(std::isfinite(fp8_max(fmt) * scale_inv)) << what;
}

// Every amax of the top two binades (a stride through their patterns, and
// both ends), with and without power_2_scale and epsilon.
TEST(ScaleRange, ComputedScaleInvKeepsFp8MaxFinite) {
  std::vector<float> amaxes = {FLT_MAX, 0x1.cp127f, std::nextafter(0x1.cp127f, INFINITY),
                               std::nextafter(0x1.cp127f, 0.0f), 0x1p127f, 0x1p126f};
  for (uint32_t bits = 0x7e800000u; bits <= 0x7f7fffffu; bits += 509) {
    amaxes.push_back(qtest::bits_float(bits));
  }
  for (fp8kit_dtype fmt : kFormats) {
    for (const fp8kit_current_scaling_config config :
         {fp8kit_current_scaling_config{0.0f, 0}, {0.0f, 1}, {1e30f, 1}, {0.5f, 0}}) {
      for (float amax : amaxes) {
        float scale = 0.0f, scale_inv = 0.0f;
        ASSERT_EQ(fp8kit_compute_scale(&amax, &scale, &scale_inv, fmt, &config,
                                       FP8KIT_DEVICE_CPU, 0, nullptr),
                  FP8KIT_OK)
            << fp8kit_last_error();
        const std::string what = std::string(fp8kit_dtype_name(fmt)) + " amax " +
                                 ::testing::PrintToString(amax) +
                                 (config.power_2_scale ? " pow2" : "");
        expect_dequantized_max_finite(scale_inv, fmt, what);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// Delayed scaling's margin divides the scale by 2^margin: next to FLT_MAX
// that would put fp8_max * scale_inv past it, so the scale stops at
// fp8_max / FLT_MAX (fp8kit/delayed_scaling.h); a smaller amax keeps its
// margin exactly.
TEST(ScaleRange, DelayedMarginKeepsFp8MaxFinite) {
  for (fp8kit_dtype fmt : kFormats) {
    for (int margin : {0, 1, 4, FP8KIT_MARGIN_MAX}) {
      for (float amax : {FLT_MAX, 0x1.cp127f, 0x1p126f, 0x1p100f, 3.0f}) {
        float history = 0.0f, scale = 1.0f, scale_inv = 0.0f;
        const fp8kit_delayed_scaling_state st{&history, &amax, &scale, &scale_inv, fmt};
        const fp8kit_delayed_scaling_config config{1, margin, FP8KIT_AMAX_MAX};
        ASSERT_EQ(fp8kit_delayed_scaling_update(&st, 1, &config, FP8KIT_DEVICE_CPU, 0, nullptr),
                  FP8KIT_OK)
            << fp8kit_last_error();
        const std::string what = std::string(fp8kit_dtype_name(fmt)) + " margin " +
                                 std::to_string(margin) + " amax " +
                                 ::testing::PrintToString(amax);
        expect_dequantized_max_finite(scale_inv, fmt, what);
        const double exact = double(fp8_max(fmt)) / double(amax) / std::exp2(margin);
        if (exact * double(FLT_MAX) >= double(fp8_max(fmt)) * 1.001) {
          // Far from FLT_MAX: the margin is applied as asked (to float32's rounding).
          EXPECT_NEAR(double(scale) / exact, 1.0, 1e-6) << what;
        }
      }
    }
  }
}

// The numbers: at amax = FLT_MAX, fp8_max / amax = 1.75 * 2^-120 (E4M3) or
// 1.75 * 2^-113 (E5M2); rounded down to a power of two that is 2^-120 /
// 2^-113, whose scale_inv 2^120 / 2^113 dequantizes FLT_MAX's code (256 /
// 32768) to 2^128 = inf. The power of two above keeps it finite.
TEST(ScaleRange, PowerOfTwoScaleAtFltMax) {
  const fp8kit_current_scaling_config pow2{0.0f, 1};
  const float amax = FLT_MAX;
  for (auto [fmt, want] : {std::pair<fp8kit_dtype, float>{FP8KIT_E4M3, 0x1p-119f},
                           {FP8KIT_E5M2, 0x1p-112f}}) {
    float scale = 0.0f, scale_inv = 0.0f;
    ASSERT_EQ(fp8kit_compute_scale(&amax, &scale, &scale_inv, fmt, &pow2, FP8KIT_DEVICE_CPU, 0,
                                   nullptr),
              FP8KIT_OK);
    EXPECT_EQ(scale, want) << fp8kit_dtype_name(fmt);
    EXPECT_EQ(scale_inv, 1.0f / want);
  }
}

// Finite values near the largest finite `top` (FLT_MAX, or bfloat16's
// 0x1.fep127), both signs: `top` itself, the power-of-two boundary
// 1.75 * 2^127 and its neighbours, and random values in [2^124, top], so
// that every 1x128 tile holds some of the largest.
std::vector<float> near_flt_max(size_t n, uint32_t seed, float top = FLT_MAX) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(124.0, 128.0);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = std::min(top, float(std::min(double(FLT_MAX), std::exp2(u(rng)))));
    x[i] = rng() % 2 ? v : -v;
  }
  const float edges[] = {top, -top, 0x1.cp127f, std::nextafter(0x1.cp127f, INFINITY),
                         -std::nextafter(0x1.cp127f, 0.0f), 0x1.fp127f, 0x1p127f};
  for (size_t i = 0; i < n; ++i) {
    if (i % 61 == 0) x[i] = edges[(i / 61) % 7];
  }
  return x;
}

// Dequantized finite values stay finite and within the cast's error: the
// rounding (2^-4 relative for E4M3, 2^-3 for E5M2) or, above the largest
// value the scale reaches (1.75 * 2^127 at the power-of-two floor), the
// saturation, under 2^-3 of |x|; checked in float64.
void expect_close_and_finite(const std::vector<float>& x, const std::vector<float>& y,
                             const std::string& what) {
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << what << ": x " << x[i] << " dequantizes to " << y[i];
    ASSERT_LE(std::fabs(double(y[i]) - double(x[i])), 0.125 * std::fabs(double(x[i])))
        << what << ": x " << x[i] << " dequantizes to " << y[i];
  }
}

TEST(ScaleRange, BlocksNearFltMaxDequantizeFinite) {
  const std::vector<int64_t> shape = {256, 256};
  uint32_t seed = 3;
  for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16}) {
    const float top = in == FP8KIT_BFLOAT16 ? 0x1.fep127f : FLT_MAX;
    const std::vector<uint8_t> input =
        qtest::encode_input(near_flt_max(256 * 256, seed++, top), in);
    std::vector<float> x(256 * 256);
    for (size_t i = 0; i < x.size(); ++i) x[i] = qtest::input_value(input, in, i);
    for (fp8kit_scaling_mode mode : kModes) {
      for (fp8kit_dtype fmt : kFormats) {
        for (int pow2 : {0, 1}) {
          Spec s;
          s.in_dtype = in;
          s.shape = shape;
          s.mode = mode;
          s.fp8 = fmt;
          s.config.power_2_scale = pow2;
          const std::string what = blocktest::spec_name(s);
          const blocktest::Result r = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
          ASSERT_EQ(r.status, FP8KIT_OK) << what << ": " << r.error;
          for (bool columnwise : {false, true}) {
            const blocktest::Copy& c = columnwise ? r.columnwise : r.rowwise;
            blocktest::expect_same_copy(c, blocktest::model_copy(s, input, columnwise), what);
            for (float si : c.scales) expect_dequantized_max_finite(si, fmt, what);
            expect_close_and_finite(x, dequantize_block(s, c, columnwise),
                                    what + (columnwise ? " columnwise" : " rowwise"));
          }
        }
      }
    }
  }
}

TEST(ScaleRange, CurrentScalingNearFltMaxDequantizesFinite) {
  const std::vector<float> x = near_flt_max(64 * 96, 17);
  for (fp8kit_dtype fmt : kFormats) {
    for (int pow2 : {0, 1}) {
      QuantSpec s;
      s.in_dtype = FP8KIT_FLOAT32;
      s.shape = {64, 96};
      s.fp8 = fmt;
      s.current = true;
      s.config = {0.0f, pow2};
      const QuantResult r =
          qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, FP8KIT_FLOAT32));
      ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
      const std::string what = std::string(fp8kit_dtype_name(fmt)) + (pow2 ? " pow2" : "");
      expect_dequantized_max_finite(r.scale_inv, fmt, what);
      expect_close_and_finite(x, dequantize_per_tensor(r.data, fmt, s.shape, r.scale_inv), what);
    }
  }
}

// ------------------------------------------------------------------ GPU --

#ifdef FP8KIT_WITH_CUDA

TEST(NonFiniteRangeGpu, EqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  std::vector<float> mixed = qtest::random_values(300 * 260, 3.0f, 9, true, true);
  const std::vector<float> huge = near_flt_max(300 * 260, 10);
  for (size_t i = 0; i < mixed.size(); i += 3) mixed[i] = huge[i];
  for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
    const std::vector<uint8_t> input = qtest::encode_input(mixed, in);
    for (fp8kit_dtype fmt : kFormats) {
      for (int pow2 : {0, 1}) {
        for (fp8kit_scaling_mode mode : kModes) {
          Spec s;
          s.in_dtype = in;
          s.shape = {300, 260};
          s.mode = mode;
          s.fp8 = fmt;
          s.config.power_2_scale = pow2;
          const std::string what = blocktest::spec_name(s);
          const blocktest::Result cpu = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
          const blocktest::Result gpu = blocktest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
          ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
          blocktest::expect_same_copy(gpu.rowwise, cpu.rowwise, what + " rowwise");
          blocktest::expect_same_copy(gpu.columnwise, cpu.columnwise, what + " columnwise");
        }
        for (bool current : {false, true}) {
          QuantSpec s;
          s.in_dtype = in;
          s.shape = {300, 260};
          s.fp8 = fmt;
          s.current = current;
          s.scale = 1e-30f;
          s.config = {0.0f, pow2};
          qtest::expect_same_result(qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input),
                                    qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input),
                                    std::string(fp8kit_dtype_name(in)) + "->" +
                                        fp8kit_dtype_name(fmt) + (current ? " current" : ""));
        }
      }
    }
  }
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
