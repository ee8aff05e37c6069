// fp8kit's own float32 exp, tanh and sigmoid (common/src/float_math.h)
// against float64 libm over a dense sweep of float32 (every 257th bit
// pattern, both signs: tiny, denormal, large and saturating arguments),
// and their special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "float_math.h"

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// |got - want| in units of the float32 ulp at `want` (denormal ulp below
// FLT_MIN); huge when got is non-finite and want is not, or vice versa.
double ulps(float got, double want) {
  if (std::isinf(want) || std::isinf(got)) return double(got) == want ? 0.0 : 1e30;
  const double a = std::fabs(want);
  const double ulp = a < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, std::ilogb(a) - 23);
  return std::fabs(double(got) - want) / ulp;
}

// The float32 rounding of e^x when e^x overflows float32 is +inf.
double exp_as_float(double x) {
  const double e = std::exp(x);
  return e >= 0x1.ffffffp127 ? INFINITY : e;
}

TEST(FloatMath, ExpTanhSigmoidWithinAFewUlp) {
  double worst_exp = 0, worst_tanh = 0, worst_sigmoid = 0;
  float at_exp = 0, at_tanh = 0, at_sigmoid = 0;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 257) {
    const float x = from_bits(uint32_t(b));
    if (std::isnan(x)) continue;
    const double e = ulps(fp8kit::exp_f32(x), exp_as_float(x));
    const double t = ulps(fp8kit::tanh_f32(x), std::tanh(double(x)));
    const double s = ulps(fp8kit::sigmoid_f32(x), 1.0 / (1.0 + std::exp(-double(x))));
    if (e > worst_exp) worst_exp = e, at_exp = x;
    if (t > worst_tanh) worst_tanh = t, at_tanh = x;
    if (s > worst_sigmoid) worst_sigmoid = s, at_sigmoid = x;
  }
  EXPECT_LE(worst_exp, 1.0) << "exp at " << at_exp;
  EXPECT_LE(worst_tanh, 4.0) << "tanh at " << at_tanh;
  EXPECT_LE(worst_sigmoid, 4.0) << "sigmoid at " << at_sigmoid;
}

TEST(FloatMath, SpecialValues) {
  EXPECT_EQ(fp8kit::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(fp8kit::exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(fp8kit::exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(fp8kit::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fp8kit::exp_f32(88.8f), INFINITY);
  EXPECT_EQ(fp8kit::exp_f32(-104.0f), 0.0f);
  EXPECT_EQ(fp8kit::exp_f32(-103.0f), float(std::exp(-103.0)));  // a denormal, rounded once
  EXPECT_TRUE(std::isnan(fp8kit::exp_f32(NAN)));
  EXPECT_EQ(fp8kit::tanh_f32(INFINITY), 1.0f);
  EXPECT_EQ(fp8kit::tanh_f32(-INFINITY), -1.0f);
  EXPECT_EQ(fp8kit::tanh_f32(9.1f), 1.0f);
  EXPECT_EQ(fp8kit::tanh_f32(1e-40f), 1e-40f);  // denormal: tanh x = x
  EXPECT_TRUE(std::signbit(fp8kit::tanh_f32(-0.0f)));
  EXPECT_EQ(fp8kit::tanh_f32(-0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(fp8kit::tanh_f32(NAN)));
  EXPECT_EQ(fp8kit::sigmoid_f32(INFINITY), 1.0f);
  EXPECT_EQ(fp8kit::sigmoid_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fp8kit::sigmoid_f32(0.0f), 0.5f);
  EXPECT_TRUE(std::isnan(fp8kit::sigmoid_f32(NAN)));
}

}  // namespace
