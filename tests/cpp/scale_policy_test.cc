// The scale policy of fp8kit/quantize.h for quantization with a given
// scale: a scale that is not finite and > 0 (0, -0, negative, +-inf, NaN)
// makes every output byte the FP8 NaN code 0x7F, rowwise and columnwise,
// and scale_inv NaN; the amax and column sums are still the input's; a
// positive denormal scale is valid. Checked for fp8kit_quantize and
// fp8kit_quantize_delayed_update (state scale and fresh-slot seed), on the
// CPU against these independent expectations, and CUDA == CPU bit for bit.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_run.h"
#include "quant_test_util.h"

namespace {

using fused::FusedRun;
using fused::Member;
using fused::MemberResult;
using qtest::QuantResult;
using qtest::QuantSpec;

constexpr uint8_t kNanCode = 0x7f;          // NaN in E4M3 and E5M2
constexpr uint32_t kNanBits = 0x7fc00000u;  // the NaN scale_inv, on CPU and CUDA

// Every scale the policy refuses, with a name for messages.
struct BadScale {
  float value;
  const char* name;
};
const BadScale kBadScales[] = {
    {0.0f, "0"},          {-0.0f, "-0"},          {-1.0f, "-1"},
    {-1e-42f, "-denormal"}, {-FLT_MAX, "-FLT_MAX"}, {INFINITY, "inf"},
    {-INFINITY, "-inf"},  {NAN, "NaN"},            {-NAN, "-NaN"}};

// Valid scales at the edges: the smallest positive denormal, a larger
// denormal, the smallest normal, the largest finite.
const float kEdgeScales[] = {1e-45f, 1e-40f, FLT_MIN, FLT_MAX};

std::string scale_name(float scale) {
  std::ostringstream os;
  os << scale;
  return os.str();
}

std::string spec_name(const QuantSpec& s, const std::string& scale) {
  std::string d = std::string(fp8kit_dtype_name(s.in_dtype)) + "->" + fp8kit_dtype_name(s.fp8) +
                  " [";
  for (size_t i = 0; i < s.shape.size(); ++i) d += (i ? "," : "") + std::to_string(s.shape[i]);
  return d + "] rowwise=" + std::to_string(s.rowwise) +
         " columnwise=" + std::to_string(s.columnwise) + " scale " + scale;
}

void expect_all_nan_codes(const std::vector<uint8_t>& bytes, const std::string& what) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != kNanCode) {
      ADD_FAILURE() << what << ": byte " << i << " is 0x" << std::hex << int(bytes[i])
                    << ", want the NaN code 0x7f";
      return;
    }
  }
}

// Specs covering both formats, the three input dtypes and every layout
// (flat, cast+transpose with and without the rowwise copy, a single row).
std::vector<QuantSpec> policy_specs() {
  std::vector<QuantSpec> v;
  const fp8kit_dtype ins[] = {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16};
  const std::vector<std::vector<int64_t>> shapes = {{37}, {65, 130}, {1, 300}, {3, 5, 7}};
  int k = 0;
  for (const auto& shape : shapes) {
    for (bool rowwise : {true, false}) {
      QuantSpec s;
      s.in_dtype = ins[k % 3];
      s.fp8 = k % 2 == 0 ? FP8KIT_E4M3 : FP8KIT_E5M2;
      s.shape = shape;
      s.rowwise = rowwise;
      s.columnwise = !rowwise || k % 2 == 0;
      v.push_back(s);
      ++k;
    }
  }
  return v;
}

std::vector<uint8_t> input_for(const QuantSpec& s, uint32_t seed) {
  return qtest::encode_input(
      qtest::random_values(size_t(qtest::numel(s.shape)), 30.0f, seed, /*specials=*/true),
      s.in_dtype);
}

TEST(ScalePolicy, QuantizeWithABadScaleGivesNanEverywhere) {
  uint32_t seed = 1;
  for (const QuantSpec& base : policy_specs()) {
    const std::vector<uint8_t> input = input_for(base, seed++);
    const size_t n = size_t(qtest::numel(base.shape));
    for (const BadScale& bad : kBadScales) {
      QuantSpec s = base;
      s.scale = bad.value;
      const std::string what = spec_name(s, bad.name);
      const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
      ASSERT_EQ(r.status, FP8KIT_OK) << what << ": " << r.error;
      EXPECT_EQ(r.data.size(), s.rowwise ? n : 0u) << what;
      EXPECT_EQ(r.columnwise.size(), s.columnwise ? n : 0u) << what;
      expect_all_nan_codes(r.data, what + " rowwise");
      expect_all_nan_codes(r.columnwise, what + " columnwise");
      EXPECT_EQ(qtest::float_bits(r.scale_inv), kNanBits) << what << ": scale_inv " << r.scale_inv;
      EXPECT_TRUE(qtest::same_float(r.amax, qtest::ref_amax(input, s.in_dtype, n)))
          << what << ": amax " << r.amax;
      EXPECT_TRUE(qtest::same_float(r.scale, bad.value)) << what << ": the scale is only read";
    }
  }
}

TEST(ScalePolicy, EdgeScalesThatAreFiniteAndPositiveAreUsed) {
  uint32_t seed = 100;
  for (const QuantSpec& base : policy_specs()) {
    const std::vector<uint8_t> input = input_for(base, seed++);
    for (float scale : kEdgeScales) {
      QuantSpec s = base;
      s.scale = scale;
      const std::string what = spec_name(s, scale_name(scale));
      const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
      ASSERT_EQ(r.status, FP8KIT_OK) << what << ": " << r.error;
      qtest::expect_matches_reference(s, input, r, scale);
      // 1 / a tiny denormal overflows float32 to inf: scale_inv = 1/scale
      // as documented, not the NaN of the policy.
      EXPECT_EQ(qtest::float_bits(r.scale_inv), qtest::float_bits(float(1.0 / double(scale))))
          << what << ": scale_inv " << r.scale_inv;
    }
  }
}

TEST(ScalePolicy, EmptyTensorStillGetsANanScaleInv) {
  for (const BadScale& bad : kBadScales) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{0}, {4, 0}}) {
      fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, nullptr);
      fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E5M2, shape, nullptr);
      float scale = bad.value, scale_inv = 1.0f, amax = -1.0f;
      out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
      out.scale = &scale;
      out.scale_inv = &scale_inv;
      out.amax = &amax;
      ASSERT_EQ(fp8kit_quantize(&in, &out, nullptr), FP8KIT_OK) << fp8kit_last_error();
      EXPECT_EQ(qtest::float_bits(scale_inv), kNanBits) << bad.name;
      EXPECT_EQ(amax, 0.0f) << bad.name;
    }
  }
}

// --------------------------------------- fp8kit_quantize_delayed_update --

const std::vector<float> kX = {1.5f, -6.0f, 0.25f, 3.0f, 0.0f, -1.0f, 2.0f, 5.5f};

Member delayed_member(const std::vector<float>& x, float scale, int seeded) {
  Member m;
  m.spec.in_dtype = FP8KIT_FLOAT32;
  m.spec.shape = {2, int64_t(x.size() / 2)};
  m.spec.fp8 = FP8KIT_E4M3;
  m.spec.rowwise = true;
  m.spec.columnwise = true;
  m.input = qtest::encode_input(x, FP8KIT_FLOAT32);
  m.history = {4.0f, 0.0f, 0.0f};
  m.scale = scale;
  m.seeded = seeded;
  return m;
}

TEST(ScalePolicy, DelayedUpdateWithABadStateScaleGivesNanThenRecovers) {
  const fp8kit_delayed_scaling_config c{3, 0, FP8KIT_AMAX_MAX};
  for (const BadScale& bad : kBadScales) {
    for (int seeded : {-1, 1}) {  // no flag, or a seeded slot: the state's scale is used
      const std::string what = std::string(bad.name) + " seeded " + std::to_string(seeded);
      FusedRun run(FP8KIT_DEVICE_CPU, {delayed_member(kX, bad.value, seeded)}, c);
      ASSERT_EQ(run.call(/*record=*/0), FP8KIT_OK) << fp8kit_last_error();
      MemberResult r = run.results()[0];
      expect_all_nan_codes(r.data, what + " rowwise, not recording");
      expect_all_nan_codes(r.columnwise, what + " columnwise, not recording");
      EXPECT_EQ(qtest::float_bits(r.out_scale_inv), kNanBits) << what;
      EXPECT_TRUE(qtest::same_float(r.scale, bad.value)) << what << ": not recording keeps it";
      EXPECT_EQ(r.history, (std::vector<float>{4.0f, 0.0f, 0.0f})) << what;

      ASSERT_EQ(run.call(/*record=*/1), FP8KIT_OK) << fp8kit_last_error();
      r = run.results()[0];
      expect_all_nan_codes(r.data, what + " rowwise, recording");
      expect_all_nan_codes(r.columnwise, what + " columnwise, recording");
      EXPECT_EQ(qtest::float_bits(r.out_scale_inv), kNanBits) << what;
      // The amax is still measured and recorded, and gives the next scale.
      EXPECT_EQ(r.history, (std::vector<float>{6.0f, 4.0f, 0.0f})) << what;
      EXPECT_EQ(r.scale, 448.0f / 6.0f) << what;
      EXPECT_EQ(r.scale_inv, 1.0f / (448.0f / 6.0f)) << what;
      EXPECT_EQ(r.amax, 0.0f) << what;
      EXPECT_EQ(r.counter, 0u) << what;
    }
  }
}

TEST(ScalePolicy, DelayedUpdateKeepsANanScaleWhenTheAmaxGivesNoNewOne) {
  // An all-zero tensor gives no new scale, so the update keeps the scale
  // used: NaN, and the state stays refused rather than plausible.
  const std::vector<float> zeros(8, 0.0f);
  Member m = delayed_member(zeros, -2.0f, -1);
  m.history = {0.0f, 0.0f, 0.0f};
  FusedRun run(FP8KIT_DEVICE_CPU, {m}, {3, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
  const MemberResult r = run.results()[0];
  expect_all_nan_codes(r.data, "rowwise");
  EXPECT_EQ(qtest::float_bits(r.scale), kNanBits);
  EXPECT_EQ(qtest::float_bits(r.scale_inv), kNanBits);
  EXPECT_EQ(r.history, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

TEST(ScalePolicy, FreshSlotSeedReplacesABadStateScale) {
  // A fresh slot casts with the seed from its own amax, so a bad initial
  // scale is never used ...
  FusedRun run(FP8KIT_DEVICE_CPU, {delayed_member(kX, NAN, 0)}, {3, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
  MemberResult r = run.results()[0];
  const float seed = 448.0f / 6.0f;
  for (size_t i = 0; i < kX.size(); ++i) {
    EXPECT_EQ(r.data[i], qtest::ref_quantize(kX[i], seed, FP8KIT_E4M3)) << i;
  }
  EXPECT_EQ(r.out_scale_inv, 1.0f / seed);
  EXPECT_EQ(r.seeded, 1);
  // ... unless the tensor gives no seed (all zeros): then the bad scale is
  // the one used, and the policy applies.
  FusedRun zero_run(FP8KIT_DEVICE_CPU, {delayed_member(std::vector<float>(8, 0.0f), 0.0f, 0)},
                    {3, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(zero_run.call(), FP8KIT_OK) << fp8kit_last_error();
  r = zero_run.results()[0];
  expect_all_nan_codes(r.data, "zero tensor, fresh slot, scale 0");
  EXPECT_EQ(qtest::float_bits(r.out_scale_inv), kNanBits);
}

TEST(ScalePolicy, DelayedUpdateColumnSumsDoNotDependOnTheScale) {
  // Column sums of a [4, 3] input, with a good and with a bad scale.
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, -4.0f, 5.5f, 6.0f,
                                7.0f, 8.0f, -9.0f, 10.0f, 11.0f, 0.5f};
  const std::vector<float> want = {14.0f, 26.5f, 0.5f};
  for (float scale : {2.0f, 0.0f, NAN}) {
    const std::vector<int64_t> shape = {4, 3};
    std::vector<uint8_t> q(12), qt(12);
    float hist[2] = {}, amax = 0.0f, s = scale, s_inv = 0.0f, out_inv = 0.0f;
    unsigned int counter = 0, sum_counter = 0;
    float sums[3] = {-1.0f, -1.0f, -1.0f}, partials[3] = {};
    fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape,
                                          const_cast<float*>(x.data()));
    fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, q.data());
    out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    out.columnwise_data = qt.data();
    out.scale_inv = &out_inv;
    const fp8kit_delayed_quantize_state st{hist, &amax, &s, &s_inv, &counter, nullptr};
    const fp8kit_column_sums cs{sums, FP8KIT_FLOAT32, partials, &sum_counter};
    const fp8kit_delayed_scaling_config c{2, 0, FP8KIT_AMAX_MAX};
    ASSERT_EQ(fp8kit_quantize_delayed_update(&in, &out, &st, &cs, 1, &c, 1, nullptr), FP8KIT_OK)
        << fp8kit_last_error();
    EXPECT_EQ(std::vector<float>(sums, sums + 3), want) << "scale " << scale_name(scale);
    EXPECT_EQ(hist[0], 11.0f) << "scale " << scale_name(scale);
    if (!(scale > 0.0f)) expect_all_nan_codes(q, "rowwise, scale " + scale_name(scale));
  }
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaScalePolicy, QuantizeMatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  std::vector<float> scales;
  for (const BadScale& bad : kBadScales) scales.push_back(bad.value);
  for (float s : kEdgeScales) scales.push_back(s);
  std::vector<QuantSpec> specs = policy_specs();
  QuantSpec empty;
  empty.shape = {0, 64};
  specs.push_back(empty);
  for (const QuantSpec& base : specs) {
    const std::vector<uint8_t> input = input_for(base, seed++);
    for (float scale : scales) {
      QuantSpec s = base;
      s.scale = scale;
      const std::string what = spec_name(s, scale_name(scale));
      const QuantResult cpu = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
      const QuantResult gpu = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
      qtest::expect_same_result(cpu, gpu, what);
      EXPECT_EQ(qtest::float_bits(cpu.scale_inv), qtest::float_bits(gpu.scale_inv)) << what;
    }
  }
}

TEST(CudaScalePolicy, DelayedUpdateMatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  // Every cast kind of mixed_members, each with a bad state scale; fresh
  // slots (seed from the amax, or none for the empty tensor) and seeded ones.
  std::vector<Member> members = fused::mixed_members(16, 300);
  for (size_t i = 0; i < members.size(); ++i) {
    members[i].scale = kBadScales[i % (sizeof(kBadScales) / sizeof(kBadScales[0]))].value;
    members[i].seeded = i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : -1;
  }
  members.push_back(delayed_member(std::vector<float>(8, 0.0f), INFINITY, 0));
  members.back().history.resize(16, 0.0f);  // every history has the config's length
  const fp8kit_delayed_scaling_config c{16, 2, FP8KIT_AMAX_MAX};
  for (int record : {0, 1}) {
    FusedRun cpu(FP8KIT_DEVICE_CPU, members, c), gpu(FP8KIT_DEVICE_CUDA, members, c);
    for (int call = 0; call < 2; ++call) {
      ASSERT_EQ(cpu.call(record), FP8KIT_OK) << fp8kit_last_error();
      ASSERT_EQ(gpu.call(record), FP8KIT_OK) << fp8kit_last_error();
      const std::vector<MemberResult> a = cpu.results(), b = gpu.results();
      for (size_t i = 0; i < a.size(); ++i) {
        const std::string what = "record " + std::to_string(record) + " call " +
                                 std::to_string(call) + " member " + std::to_string(i);
        fused::expect_same(a[i], b[i], what);
        EXPECT_EQ(qtest::float_bits(a[i].out_scale_inv), qtest::float_bits(b[i].out_scale_inv))
            << what;
      }
    }
  }
}

#else

TEST(CudaScalePolicy, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
