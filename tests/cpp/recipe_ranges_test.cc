// The recipe ranges of fp8kit/delayed_scaling.h, one rule for the core and
// both front ends: margin in [0, FP8KIT_MARGIN_MAX], amax_history_len in
// [1, FP8KIT_AMAX_HISTORY_LEN_MAX]. Both entry points that take a
// fp8kit_delayed_scaling_config accept the bounds and refuse one past
// them, naming the field and the macro; the bound on the margin is the one
// its reason gives (2**-margin a normal float32).
#include <gtest/gtest.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"

namespace {

// Runs fp8kit_delayed_scaling_update and fp8kit_quantize_delayed_update
// (both record modes) on one small CPU tensor with `config`.
class RecipeRanges : public ::testing::Test {
 protected:
  // The status of every entry point; all must agree.
  std::vector<fp8kit_status> run_all(const fp8kit_delayed_scaling_config& config) {
    // A refused length is never read: one float stands in for it.
    const bool len_ok =
        config.amax_history_len >= 1 && config.amax_history_len <= FP8KIT_AMAX_HISTORY_LEN_MAX;
    history.assign(len_ok ? size_t(config.amax_history_len) : 1u, 1.0f);
    std::vector<fp8kit_status> got;
    amax = 2.0f;
    scale = 1.0f;
    const fp8kit_delayed_scaling_state st{history.data(), &amax, &scale, &scale_inv, FP8KIT_E4M3};
    got.push_back(fp8kit_delayed_scaling_update(&st, 1, &config, FP8KIT_DEVICE_CPU, 0, nullptr));
    messages.push_back(fp8kit_last_error());
    for (int record : {0, 1}) {
      const int64_t shape[2] = {2, 4};
      fp8kit_tensor in = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape, x);
      fp8kit_tensor out = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, shape, q);
      out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
      acc = 0.0f;
      counter = 0;
      const fp8kit_delayed_quantize_state qs{history.data(), &acc, &scale, &scale_inv, &counter,
                                             nullptr};
      got.push_back(
          fp8kit_quantize_delayed_update(&in, &out, &qs, nullptr, 1, &config, record, nullptr));
      messages.push_back(fp8kit_last_error());
    }
    return got;
  }

  void expect_ok(const fp8kit_delayed_scaling_config& config) {
    messages.clear();
    const std::vector<fp8kit_status> got = run_all(config);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], FP8KIT_OK) << "entry point " << i << ": " << messages[i];
    }
  }

  // Every entry point refuses `config` with a message containing `field`
  // (the config field) and `macro` (the bound's name).
  void expect_refused(const fp8kit_delayed_scaling_config& config, const char* field,
                      const char* macro) {
    messages.clear();
    const std::vector<fp8kit_status> got = run_all(config);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], FP8KIT_INVALID_ARGUMENT) << "entry point " << i;
      EXPECT_NE(messages[i].find(field), std::string::npos) << messages[i];
      EXPECT_NE(messages[i].find(macro), std::string::npos) << messages[i];
    }
  }

  std::vector<float> history;
  std::vector<std::string> messages;
  float x[8] = {1, -2, 3, 4, 0.5f, 6, 7, -8};
  uint8_t q[8] = {};
  float amax = 0, acc = 0, scale = 1, scale_inv = 0;
  unsigned int counter = 0;
};

TEST_F(RecipeRanges, MarginBoundsAreAcceptedAndOnePastIsRefused) {
  expect_ok({4, 0, FP8KIT_AMAX_MAX});
  expect_ok({4, FP8KIT_MARGIN_MAX, FP8KIT_AMAX_MAX});
  for (int margin : {-1, FP8KIT_MARGIN_MAX + 1, INT_MIN, INT_MAX}) {
    expect_refused({4, margin, FP8KIT_AMAX_MAX}, "config->margin", "FP8KIT_MARGIN_MAX");
  }
}

TEST_F(RecipeRanges, HistoryLengthBoundsAreAcceptedAndOnePastIsRefused) {
  expect_ok({1, 0, FP8KIT_AMAX_MOST_RECENT});
  expect_ok({FP8KIT_AMAX_HISTORY_LEN_MAX, 0, FP8KIT_AMAX_MAX});
  for (int len : {0, -1, FP8KIT_AMAX_HISTORY_LEN_MAX + 1, INT_MIN, INT_MAX}) {
    expect_refused({len, 0, FP8KIT_AMAX_MAX}, "config->amax_history_len",
                   "FP8KIT_AMAX_HISTORY_LEN_MAX");
  }
}

TEST(RecipeRangeValues, MarginMaxKeepsTwoToTheMinusMarginNormal) {
  EXPECT_GE(std::ldexp(1.0f, -FP8KIT_MARGIN_MAX), FLT_MIN);
  EXPECT_LT(std::ldexp(1.0, -(FP8KIT_MARGIN_MAX + 1)), double(FLT_MIN));
  EXPECT_EQ(FP8KIT_AMAX_HISTORY_LEN_MAX, 1 << 20);
}

}  // namespace
