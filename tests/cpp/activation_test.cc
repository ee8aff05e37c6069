// fp8kit_activation_forward / fp8kit_activation_backward on the CPU:
//   - the values against float64 GELU / SwiGLU and their derivatives
//     (libm's double tanh and exp) within a few float32 ulp, specials
//     included;
//   - the high-precision output is the float32 value (activation_math.h,
//     the documented order) rounded to the dtype, and the FP8 output,
//     scaling state and column sums equal fp8kit_quantize_delayed_update /
//     fp8kit_quantize_current_scaling of that float32 tensor, bit for bit;
//   - 0 rows, and errors naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "activation_math.h"
#include "activation_test_util.h"
#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "quant_test_util.h"

namespace {

using acttest::ActInputs;
using fusedtest::CastSpec;

double gelu64(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_grad64(double x) {
  const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double sigmoid64(double x) { return 1 / (1 + std::exp(-x)); }
double silu64(double x) { return x * sigmoid64(x); }
double silu_grad64(double x) { const double s = sigmoid64(x); return s * (1 + x * (1 - s)); }

// |got - want| within `ulps` float32 ulps of the result's magnitude, plus
// `ulps` ulps of each input term whose cancellation the result inherits
// (`scale`: the largest term's magnitude).
void expect_close(float got, double want, double scale, double ulps, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what;
    return;
  }
  if (std::isinf(want)) {
    EXPECT_EQ(double(got), want) << what;
    return;
  }
  const double tol = ulps * std::ldexp(1.0, -23) * (std::fabs(want) + scale) + 1e-37;
  EXPECT_NEAR(double(got), want, tol) << what;
}

TEST(ActivationMath, MatchesFloat64) {
  std::vector<float> xs;
  for (float x = -12.0f; x <= 12.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, 30.0f, -30.0f, 90.0f, -90.0f, 1e6f,
                  -1e6f, 1e20f, -1e20f}) {
    xs.push_back(x);
  }
  for (float x : xs) {
    const std::string at = "x=" + std::to_string(x);
    const double x3 = 0.044715 * double(x) * x * x;
    // GELU: the inner polynomial rounds three times before tanh.
    expect_close(fp8kit::gelu_f32(x), gelu64(x), 0.5 * std::fabs(x) * std::fabs(x3) * 0.8, 8,
                 "gelu " + at);
    expect_close(fp8kit::gelu_grad_f32(x), gelu_grad64(x), 1 + std::fabs(x) * (1 + std::fabs(x3)), 16,
                 "gelu' " + at);
    expect_close(fp8kit::silu_f32(x), silu64(x), 0, 6, "silu " + at);
    expect_close(fp8kit::silu_grad_f32(x), silu_grad64(x), 1 + std::fabs(x) * sigmoid64(x), 8,
                 "silu' " + at);
  }
  // Limits at +-inf, and NaN.
  EXPECT_EQ(fp8kit::gelu_f32(INFINITY), INFINITY);
  EXPECT_EQ(fp8kit::gelu_f32(-INFINITY), 0.0f);
  EXPECT_TRUE(std::signbit(fp8kit::gelu_f32(-INFINITY)));
  EXPECT_EQ(fp8kit::gelu_grad_f32(INFINITY), 1.0f);
  EXPECT_EQ(fp8kit::gelu_grad_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fp8kit::silu_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fp8kit::silu_f32(INFINITY), INFINITY);
  EXPECT_EQ(fp8kit::silu_grad_f32(INFINITY), 1.0f);
  EXPECT_EQ(fp8kit::silu_grad_f32(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(fp8kit::gelu_f32(NAN)));
  EXPECT_TRUE(std::isnan(fp8kit::silu_grad_f32(NAN)));
}

// The float32 values the op computes, by activation_math.h (whose
// agreement with float64 the test above checks).
std::vector<float> values(const ActInputs& in, bool backward) {
  const auto [rows, f] = qtest::flat2d(in.a_shape);
  const int64_t hc = in.act == FP8KIT_SWIGLU ? 2 * f : f;
  auto h = [&](int64_t r, int64_t c) { return qtest::input_value(in.h, in.dtype, size_t(r * hc + c)); };
  auto da = [&](int64_t r, int64_t c) { return qtest::input_value(in.d_a, in.dtype, size_t(r * f + c)); };
  std::vector<float> v(size_t(rows * (backward ? hc : f)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < f; ++c) {
      if (in.act == FP8KIT_GELU) {
        v[size_t(r * f + c)] = backward ? fp8kit::gelu_backward_f32(da(r, c), h(r, c))
                                        : fp8kit::gelu_f32(h(r, c));
      } else if (!backward) {
        v[size_t(r * f + c)] = fp8kit::swiglu_f32(h(r, c), h(r, f + c));
      } else {
        const fp8kit::SwigluGrad g = fp8kit::swiglu_grad_f32(da(r, c), h(r, c), h(r, f + c));
        v[size_t(r * hc + c)] = g.d_gate;
        v[size_t(r * hc + f + c)] = g.d_up;
      }
    }
  }
  return v;
}

TEST(Activation, CpuOutputsAndCastSemantics) {
  uint32_t seed = 1;
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (bool backward : {false, true}) {
      for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        for (const std::vector<int64_t>& shape :
             std::vector<std::vector<int64_t>>{{3, 5, 48}, {130, 144}, {1, 16}}) {
          for (CastSpec spec : fusedtest::cast_specs()) {
            spec.sums = backward && spec.columnwise && qtest::flat2d(shape).first > 1;
            spec.sums_dtype = dtype;
            const uint32_t case_seed = seed++;
            const ActInputs in =
                acttest::make_inputs(act, dtype, shape, case_seed, case_seed % 2 == 0);
            const std::string what = std::string(act == FP8KIT_GELU ? "GELU " : "SwiGLU ") +
                                     (backward ? "backward " : "forward ") +
                                     fp8kit_dtype_name(dtype) + " " + fusedtest::spec_name(spec);
            const acttest::ActResult got = acttest::run(FP8KIT_DEVICE_CPU, in, backward, spec);
            ASSERT_EQ(got.status, FP8KIT_OK) << what << ": " << got.error;
            const std::vector<float> v = values(in, backward);
            EXPECT_EQ(got.hp, fusedtest::rounded_bytes(v, dtype)) << what << ": high precision";
            fusedtest::expect_same_cast(
                got.cast, fusedtest::reference_cast(spec, backward ? in.h_shape : in.a_shape, v),
                what);
          }
        }
      }
    }
  }
}

// The column sums of dh are the sums of the float32 dh (not of dh rounded
// to the input dtype): checked against float64 sums within rounding.
TEST(Activation, BackwardColumnSumsMatchFloat64) {
  const ActInputs in = acttest::make_inputs(FP8KIT_SWIGLU, FP8KIT_BFLOAT16, {300, 32}, 5);
  CastSpec spec;
  spec.sums = true;
  const acttest::ActResult got = acttest::run(FP8KIT_DEVICE_CPU, in, true, spec);
  ASSERT_EQ(got.status, FP8KIT_OK) << got.error;
  const std::vector<float> v = values(in, true);
  for (int c = 0; c < 64; ++c) {
    double sum = 0, abs = 0;
    for (int r = 0; r < 300; ++r) {
      sum += v[size_t(r * 64 + c)];
      abs += std::fabs(v[size_t(r * 64 + c)]);
    }
    float s;
    std::memcpy(&s, &got.cast.sums[size_t(c) * 4], 4);
    EXPECT_NEAR(s, sum, 1e-5 * abs) << c;
  }
}

TEST(Activation, ZeroRows) {
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (const CastSpec& spec : fusedtest::cast_specs()) {
      const ActInputs in = acttest::make_inputs(act, FP8KIT_BFLOAT16, {0, 32}, 3);
      for (bool backward : {false, true}) {
        const acttest::ActResult got = acttest::run(FP8KIT_DEVICE_CPU, in, backward, spec);
        ASSERT_EQ(got.status, FP8KIT_OK) << got.error;
        fusedtest::expect_same_cast(
            got.cast, fusedtest::reference_cast(spec, backward ? in.h_shape : in.a_shape, {}),
            fusedtest::spec_name(spec));
      }
    }
  }
}

// Without the FP8 output and cast, a (forward) or dh (backward) alone:
// the same bits as an activation that casts.
TEST(Activation, WithoutCastWritesTheSameValues) {
  uint32_t seed = 60;
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (bool backward : {false, true}) {
        const ActInputs in = acttest::make_inputs(act, dtype, {3, 5, 32}, seed++, true);
        const acttest::ActResult cast = acttest::run(FP8KIT_DEVICE_CPU, in, backward, CastSpec());
        const acttest::ActResult plain =
            acttest::run(FP8KIT_DEVICE_CPU, in, backward, CastSpec(), 1, /*cast_output=*/false);
        ASSERT_EQ(plain.status, FP8KIT_OK) << plain.error;
        EXPECT_EQ(plain.hp, cast.hp) << (backward ? "backward" : "forward");
      }
    }
  }
}

TEST(Activation, ErrorsNameTheArgument) {
  const fp8kit_device_type cpu = FP8KIT_DEVICE_CPU;
  alignas(16) static uint16_t h[4 * 64], a[4 * 32], da[4 * 32], dh[4 * 64];
  alignas(16) static float sums[64], partials[64];
  static unsigned int counters[1];
  const int64_t hs[2] = {4, 64}, as[2] = {4, 32};
  fusedtest::CastBuffers fa(cpu, CastSpec(), {4, 32}), fb(cpu, CastSpec(), {4, 64});
  const fp8kit_fused_cast ca = fa.cast(), cb = fb.cast();
  fp8kit_tensor th = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, hs, h);
  fp8kit_tensor ta = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, as, a);
  fp8kit_tensor tda = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, as, da);
  fp8kit_tensor tdh = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, hs, dh);
  fp8kit_tensor qa = fa.out(), qb = fb.out();
  const fp8kit_column_sums cs{sums, FP8KIT_FLOAT32, partials, counters};
  using fusedtest::expect_names;
  ASSERT_EQ(fp8kit_activation_forward(FP8KIT_SWIGLU, &th, &ta, &qa, &ca, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  ASSERT_EQ(fp8kit_activation_backward(FP8KIT_SWIGLU, &tda, &th, &tdh, &qb, &cb, &cs, nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  expect_names(fp8kit_activation_forward(fp8kit_activation(5), &th, &ta, &qa, &ca, nullptr), "act",
               "act");
  expect_names(fp8kit_activation_forward(FP8KIT_GELU, &th, &ta, &qa, &ca, nullptr), "a",
               "GELU a of SwiGLU width");
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, nullptr, &ta, &qa, &ca, nullptr), "h",
               "h NULL");
  fp8kit_tensor bad = th;
  bad.shape[1] = 48;  // F = 24
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &bad, &ta, &qa, &ca, nullptr), "h",
               "F not a multiple of 16");
  bad = th;
  bad.data = reinterpret_cast<uint8_t*>(h) + 8;
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &bad, &ta, &qa, &ca, nullptr), "h->data",
               "misaligned h");
  bad = ta;
  bad.dtype = FP8KIT_FLOAT32;
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &th, &bad, &qa, &ca, nullptr), "a",
               "a dtype");
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &th, &ta, &qb, &ca, nullptr), "a_fp8",
               "a_fp8 shape");
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &th, &ta, &qa, nullptr, nullptr), "cast",
               "cast NULL");
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &th, &ta, nullptr, &ca, nullptr), "cast",
               "cast without a_fp8");
  expect_names(fp8kit_activation_forward(FP8KIT_SWIGLU, &th, nullptr, nullptr, nullptr, nullptr),
               "a_fp8", "neither a nor a_fp8");
  expect_names(fp8kit_activation_backward(FP8KIT_SWIGLU, &tda, &th, &tdh, nullptr, nullptr, &cs,
                                          nullptr),
               "sums", "sums without dh_fp8");
  ASSERT_EQ(fp8kit_activation_backward(FP8KIT_SWIGLU, &tda, &th, &tdh, nullptr, nullptr, nullptr,
                                       nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  bad = tda;
  bad.shape[0] = 3;
  expect_names(fp8kit_activation_backward(FP8KIT_SWIGLU, &bad, &th, &tdh, &qb, &cb, &cs, nullptr),
               "d_a", "d_a shape");
  bad = tdh;
  bad.dtype = FP8KIT_FLOAT16;
  expect_names(fp8kit_activation_backward(FP8KIT_SWIGLU, &tda, &th, &bad, &qb, &cb, &cs, nullptr),
               "dh", "dh dtype");
  fp8kit_tensor rowwise_only = qb;
  rowwise_only.columnwise_data = nullptr;
  expect_names(fp8kit_activation_backward(FP8KIT_SWIGLU, &tda, &th, &tdh, &rowwise_only, &cb, &cs,
                                          nullptr),
               "sums", "sums without columnwise");
  fp8kit_column_sums bad_sums = cs;
  bad_sums.partials = nullptr;
  expect_names(fp8kit_activation_backward(FP8KIT_SWIGLU, &tda, &th, &tdh, &qb, &cb, &bad_sums,
                                          nullptr),
               "sums", "sums without workspace");
}

}  // namespace
