// fp8kit's own float32 exp and sigmoid (common/src/float_math.h) against
// float64 libm over a dense sweep of float32 (every 257th bit pattern, both
// signs: tiny, denormal, large and saturating arguments), and their special
// values.
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

TEST(FloatMath, ExpAndSigmoidWithinAFewUlp) {
  double worst_exp = 0, worst_sigmoid = 0, worst_complement = 0;
  float at_exp = 0, at_sigmoid = 0, at_complement = 0;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 257) {
    const float x = from_bits(uint32_t(b));
    if (std::isnan(x)) continue;
    if (x <= 0.0f) {
      const double e = ulps(fp8kit::exp_nonpositive_f32(x), std::exp(double(x)));
      if (e > worst_exp) worst_exp = e, at_exp = x;
    }
    const fp8kit::Sigmoid sig = fp8kit::sigmoid_pair_f32(x);
    const double s = ulps(sig.s, 1.0 / (1.0 + std::exp(-double(x))));
    const double c = ulps(sig.complement, 1.0 / (1.0 + std::exp(double(x))));
    if (s > worst_sigmoid) worst_sigmoid = s, at_sigmoid = x;
    if (c > worst_complement) worst_complement = c, at_complement = x;
    EXPECT_EQ(fp8kit::sigmoid_f32(x), sig.s);
  }
  // float_math.h states the maxima over every float32: 0.98 and 2.41.
  EXPECT_LE(worst_exp, 1.0) << "exp at " << at_exp;
  EXPECT_LE(worst_sigmoid, 2.5) << "sigmoid at " << at_sigmoid;
  EXPECT_LE(worst_complement, 2.5) << "1 - sigmoid at " << at_complement;
}

TEST(FloatMath, SpecialValues) {
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(0.0f), 1.0f);
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(-0.0f), 1.0f);
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(-104.0f), 0.0f);
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(-1e30f), 0.0f);
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(-103.0f), 0x1p-149f);  // the smallest denormal
  EXPECT_EQ(fp8kit::exp_nonpositive_f32(-1.0f), float(std::exp(-1.0)));
  EXPECT_TRUE(std::isnan(fp8kit::exp_nonpositive_f32(NAN)));
  EXPECT_TRUE(std::isnan(fp8kit::exp_nonpositive_f32(-NAN)));

  EXPECT_EQ(fp8kit::sigmoid_f32(INFINITY), 1.0f);
  EXPECT_EQ(fp8kit::sigmoid_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fp8kit::sigmoid_f32(0.0f), 0.5f);
  EXPECT_EQ(fp8kit::sigmoid_f32(-0.0f), 0.5f);
  EXPECT_EQ(fp8kit::sigmoid_f32(17.0f), 0x1.fffffep-1f);  // 1 - 4.1e-8
  EXPECT_EQ(fp8kit::sigmoid_f32(18.0f), 1.0f);            // 1 - 1.5e-8 rounds to 1
  EXPECT_EQ(fp8kit::sigmoid_f32(-100.0f), float(std::exp(-100.0)));  // denormal e^x
  EXPECT_EQ(fp8kit::sigmoid_f32(-110.0f), 0.0f);
  EXPECT_EQ(fp8kit::sigmoid_pair_f32(INFINITY).complement, 0.0f);
  EXPECT_EQ(fp8kit::sigmoid_pair_f32(-INFINITY).complement, 1.0f);
  EXPECT_TRUE(std::isnan(fp8kit::sigmoid_f32(NAN)));
  EXPECT_TRUE(std::isnan(fp8kit::sigmoid_pair_f32(NAN).complement));
}

}  // namespace
