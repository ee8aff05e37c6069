// fp8kit_quantize_delayed_update's seeding and recording rules
// (fp8kit/delayed_scaling.h): a fresh slot's first quantization uses the
// scale its own amax gives (zero or NaN amax: the current scale) and, when
// recorded, marks the slot seeded; record == 0 casts exactly as record == 1
// would and leaves the state bit-identical (accumulator and counter 0); a
// NULL flag means seeded. CUDA == CPU bit for bit over mixed calls.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_run.h"
#include "quant_test_util.h"

namespace {

using fused::FusedRun;
using fused::Member;
using fused::MemberResult;

Member fresh_member(const std::vector<float>& x, fp8kit_dtype fp8, float scale) {
  Member m;
  m.spec.in_dtype = FP8KIT_FLOAT32;
  m.spec.shape = {2, int64_t(x.size() / 2)};
  m.spec.fp8 = fp8;
  m.spec.rowwise = true;
  m.spec.columnwise = true;
  m.input = qtest::encode_input(x, FP8KIT_FLOAT32);
  m.history = {0.0f, 0.0f, 0.0f};
  m.scale = scale;
  m.seeded = 0;
  return m;
}

std::vector<uint8_t> ref_data(const std::vector<float>& x, float scale, fp8kit_dtype fp8) {
  std::vector<uint8_t> q;
  for (float v : x) q.push_back(qtest::ref_quantize(v, scale, fp8));
  return q;
}

const std::vector<float> kStep0 = {1.5f, -6.0f, 0.25f, 3.0f, 0.0f, -1.0f, 2.0f, 5.5f};
const std::vector<float> kStep1 = {12.0f, 1.0f, -2.0f, 3.0f, 0.5f, -1.0f, 7.0f, 0.0f};

TEST(DelayedSeeding, FirstStepTakesItsOwnAmaxThenTheSlotIsSeeded) {
  for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
    const float fp8_max = float(qtest::fp8_max_value(fp8));
    // margin 1: scale = fp8_max / amax / 2.
    FusedRun run(FP8KIT_DEVICE_CPU, {fresh_member(kStep0, fp8, 1.0f)}, {3, 1, FP8KIT_AMAX_MAX});
    ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
    MemberResult r = run.results()[0];
    const float seed = fp8_max / 6.0f * 0.5f;
    EXPECT_EQ(r.out_scale_inv, 1.0f / seed);
    EXPECT_EQ(r.data, ref_data(kStep0, seed, fp8));
    EXPECT_EQ(r.history, (std::vector<float>{6.0f, 0.0f, 0.0f}));
    EXPECT_EQ(r.scale, seed);
    EXPECT_EQ(r.scale_inv, 1.0f / seed);
    EXPECT_EQ(r.seeded, 1);
    EXPECT_EQ(r.amax, 0.0f);
    EXPECT_EQ(r.counter, 0u);

    // Step 1 is an ordinary delayed step: cast with the seed, then update.
    // (The runner's input stays kStep0; a new run with the state carried
    // over feeds kStep1.)
    Member next = fresh_member(kStep1, fp8, r.scale);
    next.history = r.history;
    next.seeded = r.seeded;
    FusedRun run1(FP8KIT_DEVICE_CPU, {next}, {3, 1, FP8KIT_AMAX_MAX});
    ASSERT_EQ(run1.call(), FP8KIT_OK) << fp8kit_last_error();
    r = run1.results()[0];
    EXPECT_EQ(r.out_scale_inv, 1.0f / seed);
    EXPECT_EQ(r.data, ref_data(kStep1, seed, fp8));
    EXPECT_EQ(r.history, (std::vector<float>{12.0f, 6.0f, 0.0f}));
    EXPECT_EQ(r.scale, fp8_max / 12.0f * 0.5f);
    EXPECT_EQ(r.seeded, 1);
  }
}

TEST(DelayedSeeding, ZeroTensorKeepsTheCurrentScale) {
  const std::vector<float> zeros(8, 0.0f);
  FusedRun run(FP8KIT_DEVICE_CPU, {fresh_member(zeros, FP8KIT_E4M3, 2.0f)},
               {3, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
  const MemberResult r = run.results()[0];
  EXPECT_EQ(r.out_scale_inv, 0.5f);
  EXPECT_EQ(r.data, std::vector<uint8_t>(8, 0));
  EXPECT_EQ(r.history, (std::vector<float>{0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(r.scale, 2.0f);
  EXPECT_EQ(r.scale_inv, 0.5f);
  EXPECT_EQ(r.seeded, 1);  // recorded: the next step is an ordinary one
}

TEST(DelayedSeeding, NaNKeepsTheCurrentScale) {
  std::vector<float> x = kStep0;
  x[3] = NAN;
  FusedRun run(FP8KIT_DEVICE_CPU, {fresh_member(x, FP8KIT_E4M3, 2.0f)}, {3, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
  const MemberResult r = run.results()[0];
  EXPECT_EQ(r.out_scale_inv, 0.5f);
  EXPECT_EQ(r.data, ref_data(x, 2.0f, FP8KIT_E4M3));
  EXPECT_EQ(qtest::float_bits(r.history[0]), 0x7fc00000u) << "canonical NaN";
  EXPECT_EQ(r.scale, 2.0f);
  EXPECT_EQ(r.seeded, 1);
}

TEST(DelayedSeeding, SeededOrNoFlagCastsWithTheStateScale) {
  for (int flag : {1, -1}) {
    Member m = fresh_member(kStep0, FP8KIT_E4M3, 2.0f);
    m.seeded = flag;
    FusedRun run(FP8KIT_DEVICE_CPU, {m}, {3, 0, FP8KIT_AMAX_MAX});
    ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
    const MemberResult r = run.results()[0];
    EXPECT_EQ(r.out_scale_inv, 0.5f) << flag;
    EXPECT_EQ(r.data, ref_data(kStep0, 2.0f, FP8KIT_E4M3)) << flag;
    EXPECT_EQ(r.scale, 448.0f / 6.0f) << flag;
    EXPECT_EQ(r.seeded, flag) << flag;
  }
}

// The state a member starts from, as a result (what record == 0 must leave).
MemberResult initial_state(const Member& m) {
  MemberResult r;
  r.history = m.history;
  r.amax = 0.0f;  // the accumulator ends at 0 in both modes
  r.scale = m.scale;
  r.scale_inv = -3.0f;  // FusedRun's initial value
  r.counter = 0u;
  r.seeded = m.seeded;
  return r;
}

void expect_state(const MemberResult& got, const MemberResult& want, const std::string& what) {
  MemberResult g = got;
  g.data.clear();
  g.columnwise.clear();
  g.out_scale_inv = want.out_scale_inv;
  fused::expect_same(g, want, what);
}

// Fresh, seeded and flagless members of every cast kind.
std::vector<Member> flagged_members(int amax_history_len, uint32_t seed) {
  std::vector<Member> v = fused::mixed_members(amax_history_len, seed);
  for (size_t i = 0; i < v.size(); ++i) v[i].seeded = int(i % 3) - 1;  // -1, 0, 1
  Member zeros = fresh_member(std::vector<float>(64, 0.0f), FP8KIT_E4M3, 3.0f);
  zeros.history.assign(size_t(amax_history_len), 0.0f);
  v.push_back(zeros);
  std::vector<float> x(64, 1.0f);
  x[5] = NAN;
  Member nan = fresh_member(x, FP8KIT_E5M2, 3.0f);
  nan.history.assign(size_t(amax_history_len), 0.0f);
  v.push_back(nan);
  return v;
}

TEST(DelayedRecord, ZeroCastsAsRecordingDoesAndLeavesTheStateBitIdentical) {
  const fp8kit_delayed_scaling_config c{16, 1, FP8KIT_AMAX_MAX};
  const std::vector<Member> members = flagged_members(c.amax_history_len, 5);
  FusedRun off(FP8KIT_DEVICE_CPU, members, c), on(FP8KIT_DEVICE_CPU, members, c);
  ASSERT_EQ(off.call(/*record=*/0), FP8KIT_OK) << fp8kit_last_error();
  ASSERT_EQ(on.call(/*record=*/1), FP8KIT_OK) << fp8kit_last_error();
  const std::vector<MemberResult> a = off.results(), b = on.results();
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string what = "member " + std::to_string(i);
    expect_state(a[i], initial_state(members[i]), what);
    EXPECT_EQ(a[i].data, b[i].data) << what;
    EXPECT_EQ(a[i].columnwise, b[i].columnwise) << what;
    EXPECT_EQ(qtest::float_bits(a[i].out_scale_inv), qtest::float_bits(b[i].out_scale_inv))
        << what;
    if (members[i].seeded != -1) {
      EXPECT_EQ(b[i].seeded, 1) << what;
    }
  }
  // Again: nothing moved, so nothing moves.
  ASSERT_EQ(off.call(/*record=*/0), FP8KIT_OK) << fp8kit_last_error();
  const std::vector<MemberResult> again = off.results();
  for (size_t i = 0; i < members.size(); ++i) {
    expect_state(again[i], initial_state(members[i]), "again: member " + std::to_string(i));
  }
}

TEST(DelayedRecord, FreshSlotNotRecordedStaysFresh) {
  FusedRun run(FP8KIT_DEVICE_CPU, {fresh_member(kStep0, FP8KIT_E4M3, 1.0f)},
               {3, 0, FP8KIT_AMAX_MAX});
  ASSERT_EQ(run.call(/*record=*/0), FP8KIT_OK) << fp8kit_last_error();
  MemberResult r = run.results()[0];
  const float seed = 448.0f / 6.0f;
  EXPECT_EQ(r.out_scale_inv, 1.0f / seed);
  EXPECT_EQ(r.data, ref_data(kStep0, seed, FP8KIT_E4M3));
  EXPECT_EQ(r.seeded, 0);
  EXPECT_EQ(r.scale, 1.0f);
  EXPECT_EQ(r.history, (std::vector<float>{0.0f, 0.0f, 0.0f}));
  ASSERT_EQ(run.call(/*record=*/1), FP8KIT_OK) << fp8kit_last_error();
  r = run.results()[0];
  EXPECT_EQ(r.out_scale_inv, 1.0f / seed);  // seeded now, from the same amax
  EXPECT_EQ(r.seeded, 1);
  EXPECT_EQ(r.scale, seed);
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaDelayedSeeding, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  for (const fp8kit_delayed_scaling_config& c :
       {fp8kit_delayed_scaling_config{16, 1, FP8KIT_AMAX_MAX},
        fp8kit_delayed_scaling_config{4, 0, FP8KIT_AMAX_MOST_RECENT}}) {
    const std::vector<Member> members = flagged_members(c.amax_history_len, 17);
    FusedRun cpu(FP8KIT_DEVICE_CPU, members, c), gpu(FP8KIT_DEVICE_CUDA, members, c);
    // Not recorded first (fresh slots stay fresh), then recorded (they
    // seed), then both again: the flags, accumulators and counters carry.
    for (int record : {0, 1, 0, 1, 1}) {
      ASSERT_EQ(cpu.call(record), FP8KIT_OK) << fp8kit_last_error();
      ASSERT_EQ(gpu.call(record), FP8KIT_OK) << fp8kit_last_error();
      const std::vector<MemberResult> a = cpu.results(), b = gpu.results();
      for (size_t i = 0; i < members.size(); ++i) {
        fused::expect_same(a[i], b[i], "len " + std::to_string(c.amax_history_len) + " record " +
                                           std::to_string(record) + " member " +
                                           std::to_string(i));
      }
    }
  }
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
