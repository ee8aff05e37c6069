// fp8kit_quantize_delayed_update: on the CPU it equals fp8kit_quantize
// followed by fp8kit_delayed_scaling_update with the accumulated amax (the
// composition of two already-tested ops), state left with amax 0 and
// counter 0; errors; and CUDA == CPU bit for bit over groups of tensors of
// every cast kind, odd and empty shapes, more tensors than one launch
// takes, histories longer than a block and repeated calls (the counters
// must reset themselves).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_run.h"
#include "quant_test_util.h"

namespace {

using fused::FusedRun;
using fused::Member;
using fused::MemberResult;
using fused::expect_same;
using fused::mixed_members;


// The reference: fp8kit_quantize, then fp8kit_delayed_scaling_update with
// max(entry amax, tensor amax) as the newest amax, on the CPU.
MemberResult composed(const Member& m, const fp8kit_delayed_scaling_config& c) {
  qtest::QuantSpec s = m.spec;
  s.scale = m.scale;
  const qtest::QuantResult q = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, m.input);
  EXPECT_EQ(q.status, FP8KIT_OK) << q.error;
  MemberResult r;
  r.data = q.data;
  r.columnwise = q.columnwise;
  r.out_scale_inv = q.scale_inv;
  float newest = q.amax;
  if (std::isnan(newest)) newest = qtest::bits_float(0x7fc00000u);
  if (qtest::float_bits(m.amax) > qtest::float_bits(newest)) newest = m.amax;
  r.history = m.history;
  r.scale = m.scale;
  fp8kit_delayed_scaling_state st{r.history.data(), &newest, &r.scale, &r.scale_inv, s.fp8};
  EXPECT_EQ(fp8kit_delayed_scaling_update(&st, 1, &c, FP8KIT_DEVICE_CPU, 0, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  r.amax = 0.0f;
  r.counter = 0u;
  r.seeded = m.seeded;
  return r;
}

const fp8kit_delayed_scaling_config kConfigs[] = {
    {1, 0, FP8KIT_AMAX_MAX}, {16, 1, FP8KIT_AMAX_MAX}, {16, 0, FP8KIT_AMAX_MOST_RECENT},
    {300, 7, FP8KIT_AMAX_MAX}};

TEST(QuantizeDelayedUpdate, CpuEqualsQuantizeThenUpdate) {
  uint32_t seed = 1;
  for (const auto& c : kConfigs) {
    std::vector<Member> members = mixed_members(c.amax_history_len, seed);
    seed += 100;
    members.back().input = qtest::encode_input(
        qtest::random_values(4096, 2.0f, 9, false, /*nan=*/true), FP8KIT_BFLOAT16);
    // A slot already seeded casts as one without a flag, and stays seeded.
    for (size_t i = 0; i < members.size(); i += 2) members[i].seeded = 1;
    FusedRun run(FP8KIT_DEVICE_CPU, members, c);
    ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
    const std::vector<MemberResult> got = run.results();
    for (size_t i = 0; i < members.size(); ++i) {
      expect_same(composed(members[i], c), got[i],
                  "len " + std::to_string(c.amax_history_len) + " member " + std::to_string(i));
    }
  }
}

TEST(QuantizeDelayedUpdate, WorkedExample) {
  // amax 6 of this step rolled into [2, 1]: history [6, 2], scale 448/6;
  // the output was cast with the old scale 2 (scale_inv 0.5).
  const std::vector<float> x = {1.5f, -6.0f, 0.25f, 3.0f};
  Member m;
  m.spec.in_dtype = FP8KIT_FLOAT32;
  m.spec.shape = {2, 2};
  m.input = qtest::encode_input(x, FP8KIT_FLOAT32);
  m.history = {2.0f, 1.0f};
  m.scale = 2.0f;
  FusedRun run(FP8KIT_DEVICE_CPU, {m}, {2, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
  const MemberResult r = run.results()[0];
  EXPECT_EQ(r.history, (std::vector<float>{6.0f, 2.0f}));
  EXPECT_EQ(r.scale, 448.0f / 6.0f);
  EXPECT_EQ(r.out_scale_inv, 0.5f);
  EXPECT_EQ(r.amax, 0.0f);
  EXPECT_EQ(r.data, (std::vector<uint8_t>{qtest::ref_quantize(1.5f, 2.0f, FP8KIT_E4M3),
                                          qtest::ref_quantize(-6.0f, 2.0f, FP8KIT_E4M3),
                                          qtest::ref_quantize(0.25f, 2.0f, FP8KIT_E4M3),
                                          qtest::ref_quantize(3.0f, 2.0f, FP8KIT_E4M3)}));
}

TEST(QuantizeDelayedUpdate, Errors) {
  const fp8kit_delayed_scaling_config c{4, 0, FP8KIT_AMAX_MAX};
  std::vector<uint8_t> x(64 * 4, 0);
  std::vector<uint8_t> q(64);
  float hist[4] = {}, amax = 0, scale = 1, scale_inv = 0, amax2 = 0, scale2 = 1, sinv2 = 0;
  unsigned int counter = 0, counter2 = 0;
  float seeded = 1, seeded2 = 1;
  const std::vector<int64_t> shape = {8, 8};
  fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, x.data());
  fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, q.data());
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  fp8kit_delayed_quantize_state st{hist, &amax, &scale, &scale_inv, &counter, &seeded};
  auto expect = [&](fp8kit_tensor* ins, fp8kit_tensor* outs, fp8kit_delayed_quantize_state* sts,
                    int n, const char* needle) {
    for (int record : {1, 0}) {  // the same checks in both modes
      EXPECT_EQ(fp8kit_quantize_delayed_update(ins, outs, sts, nullptr, n, &c, record, nullptr),
                FP8KIT_INVALID_ARGUMENT) << needle;
      EXPECT_NE(std::string(fp8kit_last_error()).find(needle), std::string::npos)
          << "message: " << fp8kit_last_error() << "\nexpected to contain: " << needle;
    }
  };
  ASSERT_EQ(fp8kit_quantize_delayed_update(&in, &out, &st, nullptr, 1, &c, 1, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  fp8kit_delayed_quantize_state bad = st;
  bad.counter = nullptr;
  expect(&in, &out, &bad, 1, "counter are all required");
  bad = st;
  bad.amax = hist + 1;
  expect(&in, &out, &bad, 1, "amax points into its amax_history");
  fp8kit_tensor o2 = out;
  o2.amax = &amax;
  expect(&in, &o2, &st, 1, "leave them NULL");
  o2 = out;
  o2.dtype = FP8KIT_BFLOAT16;
  expect(&in, &o2, &st, 1, "output");
  fp8kit_tensor ins[2] = {in, in}, outs[2] = {out, out};
  fp8kit_delayed_quantize_state sts[2] = {st, st};
  expect(ins, outs, sts, 2, "share buffers");
  sts[1] = {hist, &amax2, &scale2, &sinv2, &counter2, &seeded2};
  expect(ins, outs, sts, 2, "share buffers");  // one history rolled twice
  float hist2[4] = {};
  sts[1] = {hist2, &amax2, &scale2, &sinv2, &counter2, &seeded};
  expect(ins, outs, sts, 2, "share buffers");  // one flag for two slots
  sts[0].seeded = sts[1].seeded = nullptr;  // no flags: nothing shared
  EXPECT_EQ(fp8kit_quantize_delayed_update(ins, outs, sts, nullptr, 2, &c, 1, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  expect(&in, &out, &st, 65, "count is 65");
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaQuantizeDelayedUpdate, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 7;
  for (const auto& c : kConfigs) {
    const std::vector<Member> members = mixed_members(c.amax_history_len, seed);
    seed += 100;
    FusedRun cpu(FP8KIT_DEVICE_CPU, members, c), gpu(FP8KIT_DEVICE_CUDA, members, c);
    // Three calls on the same state: the counters and amax accumulators
    // must come back to 0 by themselves, and the scales move on together.
    for (int call = 0; call < 3; ++call) {
      ASSERT_EQ(cpu.call(), FP8KIT_OK) << fp8kit_last_error();
      ASSERT_EQ(gpu.call(), FP8KIT_OK) << fp8kit_last_error();
      const std::vector<MemberResult> a = cpu.results(), b = gpu.results();
      for (size_t i = 0; i < members.size(); ++i) {
        expect_same(a[i], b[i], "len " + std::to_string(c.amax_history_len) + " call " +
                                    std::to_string(call) + " member " + std::to_string(i));
      }
    }
  }
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
