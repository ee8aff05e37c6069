// fp8kit_delayed_scaling_update: history roll, max / most-recent reduction,
// margin, keeping the previous scale for zero / NaN / inf amax, many
// tensors in one call, errors; and CUDA == CPU (more than 64 tensors, so
// several launches; histories longer than a block).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

// One tensor's state in host memory, plus the expected result computed
// here in double.
struct HostState {
  std::vector<float> history;
  float amax = 0.0f;
  float scale = 1.0f;
  float scale_inv = -1.0f;
  fp8kit_dtype fmt = FP8KIT_E4M3;
};

void expected_update(HostState& s, const fp8kit_delayed_scaling_config& c) {
  for (int i = c.amax_history_len - 1; i > 0; --i) s.history[size_t(i)] = s.history[size_t(i - 1)];
  s.history[0] = s.amax;
  double reduced = s.history[0];
  bool nan = std::isnan(s.history[0]);
  if (c.amax_reduction == FP8KIT_AMAX_MAX) {
    for (float h : s.history) {
      nan = nan || std::isnan(h);
      reduced = std::max(reduced, double(h));
    }
  }
  if (!nan && std::isfinite(reduced) && reduced > 0.0) {
    // fp8_max / amax rounded to float, then an exact power-of-two scaling.
    double q = double(float(qtest::fp8_max_value(s.fmt) / reduced));
    q = std::ldexp(q, -c.margin);
    float scale = float(q);
    if (!std::isfinite(scale)) scale = FLT_MAX;
    if (scale < FLT_MIN) scale = FLT_MIN;
    // Never below fp8_max / FLT_MAX, where fp8_max would dequantize to inf.
    const float floor = float(qtest::fp8_max_value(s.fmt) / double(FLT_MAX));
    s.scale = scale < floor ? floor : scale;
  }
  s.scale_inv = float(1.0 / double(s.scale));
}

std::vector<HostState> make_states(int count, int amax_history_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 10.0f);
  std::vector<HostState> v(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    HostState& s = v[size_t(i)];
    s.fmt = i % 3 == 0 ? FP8KIT_E5M2 : FP8KIT_E4M3;
    s.history.resize(size_t(amax_history_len));
    for (auto& h : s.history) h = u(rng);
    s.amax = u(rng) * (i % 5 == 0 ? 100.0f : 1.0f);
    s.scale = 0.5f + float(i);
    // Special amaxes on a few tensors.
    if (i % 11 == 1) s.amax = 0.0f;
    if (i % 11 == 2) s.amax = NAN;
    if (i % 11 == 3) s.amax = INFINITY;
    if (i % 11 == 4) s.amax = 1e-41f;
  }
  return v;
}

// Runs the update on `dev` for the states (copies them there and back).
fp8kit_status run_update(fp8kit_device_type dev, std::vector<HostState>& states,
                         const fp8kit_delayed_scaling_config& c) {
  std::vector<std::unique_ptr<qtest::Buffer>> bufs;
  std::vector<fp8kit_delayed_scaling_state> st(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    HostState& h = states[i];
    auto hist = std::make_unique<qtest::Buffer>(dev, h.history.size() * 4);
    auto amax = std::make_unique<qtest::Buffer>(dev, 4);
    auto scale = std::make_unique<qtest::Buffer>(dev, 4);
    auto scale_inv = std::make_unique<qtest::Buffer>(dev, 4);
    hist->upload(h.history.data(), h.history.size() * 4);
    amax->set_float(h.amax);
    scale->set_float(h.scale);
    scale_inv->set_float(h.scale_inv);
    st[i] = {hist->fptr(), amax->fptr(), scale->fptr(), scale_inv->fptr(), h.fmt};
    bufs.push_back(std::move(hist));
    bufs.push_back(std::move(amax));
    bufs.push_back(std::move(scale));
    bufs.push_back(std::move(scale_inv));
  }
  const fp8kit_status status =
      fp8kit_delayed_scaling_update(st.data(), int(st.size()), &c, dev, 0, nullptr);
  if (status != FP8KIT_OK) return status;
  for (size_t i = 0; i < states.size(); ++i) {
    HostState& h = states[i];
    const std::vector<uint8_t> hist = bufs[4 * i]->download(h.history.size() * 4);
    std::memcpy(h.history.data(), hist.data(), hist.size());
    h.scale = bufs[4 * i + 2]->get_float();
    h.scale_inv = bufs[4 * i + 3]->get_float();
  }
  return status;
}

void expect_same_states(const std::vector<HostState>& a, const std::vector<HostState>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[i].history.size(); ++j) {
      ASSERT_TRUE(qtest::same_float(a[i].history[j], b[i].history[j]))
          << what << ": state " << i << " history[" << j << "] " << a[i].history[j] << " vs "
          << b[i].history[j];
    }
    EXPECT_EQ(qtest::float_bits(a[i].scale), qtest::float_bits(b[i].scale))
        << what << ": state " << i << " scale " << a[i].scale << " vs " << b[i].scale;
    EXPECT_EQ(qtest::float_bits(a[i].scale_inv), qtest::float_bits(b[i].scale_inv))
        << what << ": state " << i << " scale_inv";
  }
}

const fp8kit_delayed_scaling_config kConfigs[] = {
    {1, 0, FP8KIT_AMAX_MAX},    {4, 0, FP8KIT_AMAX_MAX}, {16, 2, FP8KIT_AMAX_MAX},
    {16, 0, FP8KIT_AMAX_MOST_RECENT}, {300, FP8KIT_MARGIN_MAX, FP8KIT_AMAX_MAX}, {1024, 3, FP8KIT_AMAX_MOST_RECENT}};

TEST(DelayedScaling, MatchesIndependentComputation) {
  uint32_t seed = 5;
  for (const auto& c : kConfigs) {
    std::vector<HostState> got = make_states(23, c.amax_history_len, seed++);
    std::vector<HostState> want = got;
    ASSERT_EQ(run_update(FP8KIT_DEVICE_CPU, got, c), FP8KIT_OK) << fp8kit_last_error();
    for (auto& s : want) expected_update(s, c);
    expect_same_states(want, got, "len " + std::to_string(c.amax_history_len));
  }
}

TEST(DelayedScaling, WorkedExample) {
  fp8kit_delayed_scaling_config c{3, 1, FP8KIT_AMAX_MAX};
  std::vector<HostState> s(1);
  s[0].history = {4.0f, 8.0f, 2.0f};
  s[0].amax = 7.0f;
  s[0].scale = 5.0f;
  ASSERT_EQ(run_update(FP8KIT_DEVICE_CPU, s, c), FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(s[0].history, (std::vector<float>{7.0f, 4.0f, 8.0f}));
  EXPECT_EQ(s[0].scale, 28.0f);  // 448 / 8 / 2
  EXPECT_EQ(s[0].scale_inv, 1.0f / 28.0f);

  c.amax_reduction = FP8KIT_AMAX_MOST_RECENT;
  s[0].amax = 14.0f;
  ASSERT_EQ(run_update(FP8KIT_DEVICE_CPU, s, c), FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(s[0].history, (std::vector<float>{14.0f, 7.0f, 4.0f}));
  EXPECT_EQ(s[0].scale, 16.0f);  // 448 / 14 / 2

  // Zero, NaN and inf amax keep the previous scale (the history still rolls).
  for (float bad : {0.0f, NAN, INFINITY}) {
    s[0].amax = bad;
    ASSERT_EQ(run_update(FP8KIT_DEVICE_CPU, s, c), FP8KIT_OK) << fp8kit_last_error();
    EXPECT_EQ(s[0].scale, 16.0f) << bad;
    EXPECT_TRUE(qtest::same_float(s[0].history[0], bad));
  }
  // A NaN anywhere in the history poisons the max reduction.
  c.amax_reduction = FP8KIT_AMAX_MAX;
  s[0].amax = 1.0f;
  ASSERT_EQ(run_update(FP8KIT_DEVICE_CPU, s, c), FP8KIT_OK);
  EXPECT_EQ(s[0].scale, 16.0f);
}

TEST(DelayedScaling, Errors) {
  float hist[4] = {}, amax = 1.0f, scale = 1.0f, scale_inv = 1.0f;
  fp8kit_delayed_scaling_state st{hist, &amax, &scale, &scale_inv, FP8KIT_E4M3};
  fp8kit_delayed_scaling_state two[2] = {st, st};
  fp8kit_delayed_scaling_config c{4, 0, FP8KIT_AMAX_MAX};
  auto expect = [&](const fp8kit_delayed_scaling_state* s, int count,
                    const fp8kit_delayed_scaling_config* cfg, const char* fragment) {
    EXPECT_EQ(fp8kit_delayed_scaling_update(s, count, cfg, FP8KIT_DEVICE_CPU, 0, nullptr),
              FP8KIT_INVALID_ARGUMENT);
    const std::string msg = fp8kit_last_error();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find("delayed_scaling_update"), std::string::npos) << msg;
  };
  ASSERT_EQ(fp8kit_delayed_scaling_update(&st, 1, &c, FP8KIT_DEVICE_CPU, 0, nullptr), FP8KIT_OK);
  EXPECT_EQ(fp8kit_delayed_scaling_update(nullptr, 0, &c, FP8KIT_DEVICE_CPU, 0, nullptr),
            FP8KIT_OK);
  expect(&st, -1, &c, "count is -1");
  expect(nullptr, 2, &c, "states is NULL");
  expect(&st, 1, nullptr, "config is NULL");
  c.amax_history_len = 0;
  expect(&st, 1, &c, "amax_history_len is 0");
  c.amax_history_len = 4;
  c.amax_reduction = fp8kit_amax_reduction(7);
  expect(&st, 1, &c, "amax_reduction");
  c.amax_reduction = FP8KIT_AMAX_MAX;
  c.margin = 200;
  expect(&st, 1, &c, "margin");
  c.margin = 0;
  two[1].scale = nullptr;
  expect(two, 2, &c, "states[1].scale is NULL");
  two[1] = st;
  two[1].amax_history = nullptr;
  expect(two, 2, &c, "states[1].amax_history");
  two[1] = st;
  two[1].fp8_dtype = FP8KIT_FLOAT32;
  expect(two, 2, &c, "states[1].fp8_dtype is float32");
  if (!fp8kit_built_with_cuda()) {
    EXPECT_EQ(fp8kit_delayed_scaling_update(&st, 1, &c, FP8KIT_DEVICE_CUDA, 0, nullptr),
              FP8KIT_UNSUPPORTED);
  }
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaQuantDelayedScaling, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 50;
  for (const auto& c : kConfigs) {
    for (int count : {1, 64, 150}) {
      std::vector<HostState> cpu = make_states(count, c.amax_history_len, seed++);
      std::vector<HostState> gpu = cpu;
      ASSERT_EQ(run_update(FP8KIT_DEVICE_CPU, cpu, c), FP8KIT_OK) << fp8kit_last_error();
      ASSERT_EQ(run_update(FP8KIT_DEVICE_CUDA, gpu, c), FP8KIT_OK) << fp8kit_last_error();
      expect_same_states(cpu, gpu,
                         "len " + std::to_string(c.amax_history_len) + " count " + std::to_string(count));
    }
  }
}

TEST(CudaQuantDelayedScaling, AmaxMayAliasTheHistory) {
  QTEST_SKIP_WITHOUT_GPU();
  // amax pointing at h[0] (the caller keeps the newest amax in the history):
  // the roll must read it before overwriting, on both devices alike.
  for (fp8kit_device_type dev : {FP8KIT_DEVICE_CPU, FP8KIT_DEVICE_CUDA}) {
    const std::vector<float> h = {3.0f, 9.0f, 1.0f, 2.0f};
    qtest::Buffer hist(dev, 16), scale(dev, 4), scale_inv(dev, 4);
    hist.upload(h.data(), 16);
    scale.set_float(1.0f);
    fp8kit_delayed_scaling_state st{hist.fptr(), hist.fptr(), scale.fptr(), scale_inv.fptr(),
                                    FP8KIT_E4M3};
    fp8kit_delayed_scaling_config c{4, 0, FP8KIT_AMAX_MAX};
    ASSERT_EQ(fp8kit_delayed_scaling_update(&st, 1, &c, dev, 0, nullptr), FP8KIT_OK)
        << fp8kit_last_error();
    std::vector<float> got(4);
    const std::vector<uint8_t> b = hist.download(16);
    std::memcpy(got.data(), b.data(), 16);
    EXPECT_EQ(got, (std::vector<float>{3.0f, 3.0f, 9.0f, 1.0f}));
    EXPECT_EQ(scale.get_float(), 448.0f / 9.0f);
  }
}

#else

TEST(CudaQuantDelayedScaling, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
