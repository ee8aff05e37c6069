// fp8kit_linear_plan_make (fp8kit/linear.h): the copies each slot of a
// Linear writes and keeps, for every device kind, weight layout and
// gradient combination, written out case by case from the GEMM layouts.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>

#include "fp8kit/fp8kit.h"

namespace {

struct PlanCase {
  const char* name;
  int64_t tokens;
  fp8kit_weight_layout layout;
  int dgrad, wgrad, non_tn;
  // Expected, as {rowwise, columnwise}.
  fp8kit_copies x, w, dy, saved_x, saved_w;
  int wgrad_columnwise;
  int64_t wgrad_inner;
};

std::ostream& operator<<(std::ostream& os, const PlanCase& c) { return os << c.name; }

constexpr fp8kit_weight_layout kOutIn = FP8KIT_WEIGHT_OUT_IN;
constexpr fp8kit_weight_layout kInOut = FP8KIT_WEIGHT_IN_OUT;
constexpr fp8kit_copies kNone{0, 0}, kRow{1, 0}, kCol{0, 1}, kBoth{1, 1};

// TN: forward reads x, w along K; dgrad reads dy along N and w along N;
// wgrad reads x and dy along M (their columnwise copies, M padded to 16).
// Non-TN: one rowwise copy serves every GEMM unless M % 16 != 0, when
// wgrad reads padded columnwise copies of x and dy.
const PlanCase kCases[] = {
    // name                 M   layout  dg wg ntn  x      w      dy     sx     sw    cw inner
    {"TnOutInNoGrad",       32, kOutIn, 0, 0, 0, kRow,  kRow,  kNone, kNone, kNone, 1, 32},
    {"TnOutInDgrad",        32, kOutIn, 1, 0, 0, kRow,  kBoth, kRow,  kNone, kCol,  1, 32},
    {"TnOutInWgrad",        32, kOutIn, 0, 1, 0, kBoth, kRow,  kCol,  kCol,  kNone, 1, 32},
    {"TnOutInBoth",         32, kOutIn, 1, 1, 0, kBoth, kBoth, kBoth, kCol,  kCol,  1, 32},
    {"TnInOutNoGrad",       32, kInOut, 0, 0, 0, kRow,  kCol,  kNone, kNone, kNone, 1, 32},
    {"TnInOutDgrad",        32, kInOut, 1, 0, 0, kRow,  kBoth, kRow,  kNone, kRow,  1, 32},
    {"TnInOutWgrad",        32, kInOut, 0, 1, 0, kBoth, kCol,  kCol,  kCol,  kNone, 1, 32},
    {"TnInOutBoth",         32, kInOut, 1, 1, 0, kBoth, kBoth, kBoth, kCol,  kRow,  1, 32},
    {"TnOutInBothM20",      20, kOutIn, 1, 1, 0, kBoth, kBoth, kBoth, kCol,  kCol,  1, 32},
    {"TnInOutBothM1",        1, kInOut, 1, 1, 0, kBoth, kBoth, kBoth, kCol,  kRow,  1, 16},
    {"TnOutInBothM0",        0, kOutIn, 1, 1, 0, kBoth, kBoth, kBoth, kCol,  kCol,  1, 0},
    {"NonTnOutInNoGrad",    32, kOutIn, 0, 0, 1, kRow,  kRow,  kNone, kNone, kNone, 0, 32},
    {"NonTnOutInDgrad",     32, kOutIn, 1, 0, 1, kRow,  kRow,  kRow,  kNone, kRow,  0, 32},
    {"NonTnOutInWgrad",     32, kOutIn, 0, 1, 1, kRow,  kRow,  kRow,  kRow,  kNone, 0, 32},
    {"NonTnOutInBoth",      32, kOutIn, 1, 1, 1, kRow,  kRow,  kRow,  kRow,  kRow,  0, 32},
    {"NonTnInOutNoGrad",    32, kInOut, 0, 0, 1, kRow,  kRow,  kNone, kNone, kNone, 0, 32},
    {"NonTnInOutBoth",      32, kInOut, 1, 1, 1, kRow,  kRow,  kRow,  kRow,  kRow,  0, 32},
    {"NonTnOutInNoGradM20", 20, kOutIn, 0, 0, 1, kRow,  kRow,  kNone, kNone, kNone, 1, 32},
    {"NonTnOutInDgradM20",  20, kOutIn, 1, 0, 1, kRow,  kRow,  kRow,  kNone, kRow,  1, 32},
    {"NonTnOutInWgradM20",  20, kOutIn, 0, 1, 1, kBoth, kRow,  kCol,  kCol,  kNone, 1, 32},
    {"NonTnOutInBothM20",   20, kOutIn, 1, 1, 1, kBoth, kRow,  kBoth, kCol,  kRow,  1, 32},
    {"NonTnInOutBothM33",   33, kInOut, 1, 1, 1, kBoth, kRow,  kBoth, kCol,  kRow,  1, 48},
    {"NonTnOutInBothM0",     0, kOutIn, 1, 1, 1, kRow,  kRow,  kRow,  kRow,  kRow,  0, 0},
};

void expect_copies(const fp8kit_copies& got, const fp8kit_copies& want, const char* what) {
  EXPECT_EQ(got.rowwise, want.rowwise) << what << ".rowwise";
  EXPECT_EQ(got.columnwise, want.columnwise) << what << ".columnwise";
}

class LinearPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(LinearPlan, CopiesFollowTheGemmLayouts) {
  const PlanCase& c = GetParam();
  fp8kit_linear_plan plan;
  ASSERT_EQ(fp8kit_linear_plan_make(c.tokens, 64, 48, c.layout, c.dgrad, c.wgrad, c.non_tn,
                                    &plan),
            FP8KIT_OK)
      << fp8kit_last_error();
  expect_copies(plan.quantize[FP8KIT_SLOT_INPUT], c.x, "quantize[INPUT]");
  expect_copies(plan.quantize[FP8KIT_SLOT_WEIGHT], c.w, "quantize[WEIGHT]");
  expect_copies(plan.quantize[FP8KIT_SLOT_GRAD_OUTPUT], c.dy, "quantize[GRAD_OUTPUT]");
  expect_copies(plan.saved_input, c.saved_x, "saved_input");
  expect_copies(plan.saved_weight, c.saved_w, "saved_weight");
  EXPECT_EQ(plan.wgrad_columnwise, c.wgrad_columnwise);
  EXPECT_EQ(plan.wgrad_inner, c.wgrad_inner);
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearPlan, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<PlanCase>& info) {
                           return std::string(info.param.name);
                         });

// Every flag of the plan is 0 or 1, whatever nonzero value means "yes".
TEST(LinearPlanFlags, AnyNonzeroMeansYes) {
  fp8kit_linear_plan a, b;
  ASSERT_EQ(fp8kit_linear_plan_make(20, 16, 16, kOutIn, 1, 1, 1, &a), FP8KIT_OK);
  ASSERT_EQ(fp8kit_linear_plan_make(20, 16, 16, kOutIn, 7, -1, 2, &b), FP8KIT_OK);
  EXPECT_EQ(a.quantize[FP8KIT_SLOT_GRAD_OUTPUT].columnwise,
            b.quantize[FP8KIT_SLOT_GRAD_OUTPUT].columnwise);
  EXPECT_EQ(a.saved_input.columnwise, b.saved_input.columnwise);
  EXPECT_EQ(a.wgrad_inner, b.wgrad_inner);
  EXPECT_EQ(b.saved_weight.rowwise, 1);
}

struct BadCase {
  const char* name;
  int64_t tokens, in_features, out_features;
  int layout;
  bool null_plan;
  const char* message;  // a part of the expected error message
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.name; }

const BadCase kBadCases[] = {
    {"InFeaturesNotMultiple", 8, 24, 32, 0, false, "in_features is 24"},
    {"InFeaturesZero", 8, 0, 32, 0, false, "in_features is 0"},
    {"InFeaturesNegative", 8, -16, 32, 0, false, "in_features is -16"},
    {"OutFeaturesNotMultiple", 8, 32, 40, 0, false, "out_features is 40"},
    {"OutFeaturesZero", 8, 32, 0, 1, false, "out_features is 0"},
    {"NegativeTokens", -1, 32, 32, 0, false, "tokens is -1"},
    {"UnknownLayout", 8, 32, 32, 2, false, "weight_layout is 2"},
    {"NullPlan", 8, 32, 32, 0, true, "plan is NULL"},
};

class LinearPlanRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(LinearPlanRejects, WithAMessageNamingTheArgument) {
  const BadCase& c = GetParam();
  fp8kit_linear_plan plan;
  plan.wgrad_inner = -7;
  EXPECT_EQ(fp8kit_linear_plan_make(c.tokens, c.in_features, c.out_features,
                                    static_cast<fp8kit_weight_layout>(c.layout), 1, 1, 0,
                                    c.null_plan ? nullptr : &plan),
            FP8KIT_INVALID_ARGUMENT);
  const std::string msg = fp8kit_last_error();
  EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
  if (msg.find("_features") != std::string::npos) {
    EXPECT_NE(msg.find("multiple of 16"), std::string::npos) << msg;
  }
  EXPECT_EQ(plan.wgrad_inner, -7);  // untouched on failure
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearPlanRejects, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
