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
#include "quant_test_util.h"

namespace {

// One tensor of a call: its input and what to produce, and the state.
struct Member {
  qtest::QuantSpec spec;
  std::vector<uint8_t> input;
  std::vector<float> history;
  float amax = 0.0f;   // accumulator on entry
  float scale = 1.0f;
};

// What a call left behind, per member.
struct MemberResult {
  std::vector<uint8_t> data, data_t;
  float out_scale_inv = -1.0f;
  std::vector<float> history;
  float amax = -1.0f, scale = -1.0f, scale_inv = -1.0f;
  unsigned int counter = 1234u;
};

std::vector<float> floats_of(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  if (!f.empty()) std::memcpy(f.data(), b.data(), b.size());
  return f;
}

// Device-side buffers of one member, kept across calls.
struct MemberBuffers {
  std::unique_ptr<qtest::Buffer> in, out, out_t, out_scale_inv, hist, amax, scale, scale_inv,
      counter;
};

class FusedRun {
 public:
  FusedRun(fp8kit_device_type dev, std::vector<Member> members,
           const fp8kit_delayed_scaling_config& config)
      : dev_(dev), members_(std::move(members)), config_(config) {
    for (const Member& m : members_) {
      const size_t n = size_t(qtest::numel(m.spec.shape));
      MemberBuffers b;
      b.in = std::make_unique<qtest::Buffer>(dev, m.input.size());
      b.in->upload(m.input.data(), m.input.size());
      b.out = std::make_unique<qtest::Buffer>(dev, n);
      b.out_t = std::make_unique<qtest::Buffer>(dev, n);
      b.out_scale_inv = std::make_unique<qtest::Buffer>(dev, 4);
      b.hist = std::make_unique<qtest::Buffer>(dev, m.history.size() * 4);
      b.hist->upload(m.history.data(), m.history.size() * 4);
      b.amax = std::make_unique<qtest::Buffer>(dev, 4);
      b.amax->set_float(m.amax);
      b.scale = std::make_unique<qtest::Buffer>(dev, 4);
      b.scale->set_float(m.scale);
      b.scale_inv = std::make_unique<qtest::Buffer>(dev, 4);
      b.scale_inv->set_float(-3.0f);
      b.counter = std::make_unique<qtest::Buffer>(dev, 4);
      const unsigned int zero = 0;
      b.counter->upload(&zero, 4);
      bufs_.push_back(std::move(b));
    }
  }

  fp8kit_status call() {
    std::vector<fp8kit_tensor> in, out;
    std::vector<fp8kit_delayed_quantize_state> st;
    for (size_t i = 0; i < members_.size(); ++i) {
      const qtest::QuantSpec& s = members_[i].spec;
      MemberBuffers& b = bufs_[i];
      in.push_back(qtest::make_tensor(dev_, s.in_dtype, s.shape, b.in->ptr()));
      fp8kit_tensor o = qtest::make_tensor(dev_, s.fp8, s.shape, s.rowwise ? b.out->ptr() : nullptr);
      o.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
      o.columnwise_data = s.columnwise ? b.out_t->ptr() : nullptr;
      o.scale_inv = b.out_scale_inv->fptr();
      out.push_back(o);
      st.push_back({b.hist->fptr(), b.amax->fptr(), b.scale->fptr(), b.scale_inv->fptr(),
                    static_cast<unsigned int*>(b.counter->ptr())});
    }
    return fp8kit_quantize_delayed_update(in.data(), out.data(), st.data(), int(st.size()),
                                          &config_, nullptr);
  }

  std::vector<MemberResult> results() {
    std::vector<MemberResult> r(members_.size());
    for (size_t i = 0; i < members_.size(); ++i) {
      const qtest::QuantSpec& s = members_[i].spec;
      MemberBuffers& b = bufs_[i];
      const size_t n = size_t(qtest::numel(s.shape));
      if (s.rowwise) r[i].data = b.out->download(n);
      if (s.columnwise) r[i].data_t = b.out_t->download(n);
      r[i].out_scale_inv = b.out_scale_inv->get_float();
      r[i].history = floats_of(b.hist->download(members_[i].history.size() * 4));
      r[i].amax = b.amax->get_float();
      r[i].scale = b.scale->get_float();
      r[i].scale_inv = b.scale_inv->get_float();
      std::memcpy(&r[i].counter, b.counter->download(4).data(), 4);
    }
    return r;
  }

 private:
  fp8kit_device_type dev_;
  std::vector<Member> members_;
  fp8kit_delayed_scaling_config config_;
  std::vector<MemberBuffers> bufs_;
};

Member make_member(fp8kit_dtype in_dtype, std::vector<int64_t> shape, fp8kit_dtype fp8,
                   bool rowwise, bool columnwise, int history_len, uint32_t seed) {
  Member m;
  m.spec.in_dtype = in_dtype;
  m.spec.shape = std::move(shape);
  m.spec.fp8 = fp8;
  m.spec.rowwise = rowwise;
  m.spec.columnwise = columnwise;
  const size_t n = size_t(qtest::numel(m.spec.shape));
  m.input = qtest::encode_input(qtest::random_values(n, 1.0f + float(seed % 7), seed, seed % 3 == 0),
                                in_dtype);
  for (int i = 0; i < history_len; ++i) m.history.push_back(float((seed * 31 + i * 17) % 97) / 9.0f);
  m.scale = 0.25f * float(1 + seed % 13);
  m.amax = seed % 4 == 1 ? 3.5f : 0.0f;  // sometimes an amax already accumulated
  return m;
}

// The members the CUDA tests use: every cast kind, odd and empty shapes,
// all three input dtypes, both formats; 6 bf16 row+col tensors (more than
// one launch's 4) so the grouping splits.
std::vector<Member> mixed_members(int history_len, uint32_t seed) {
  std::vector<Member> v;
  for (int i = 0; i < 6; ++i) {
    v.push_back(make_member(FP8KIT_BFLOAT16, {int64_t(16 + 100 * i), 1024}, FP8KIT_E4M3, true,
                            true, history_len, seed + uint32_t(i)));
  }
  v.push_back(make_member(FP8KIT_BFLOAT16, {333, 77}, FP8KIT_E4M3, true, true, history_len, seed + 10));
  v.push_back(make_member(FP8KIT_FLOAT32, {257, 130}, FP8KIT_E5M2, false, true, history_len, seed + 11));
  v.push_back(make_member(FP8KIT_FLOAT16, {5, 3, 1000}, FP8KIT_E4M3, true, false, history_len, seed + 12));
  v.push_back(make_member(FP8KIT_BFLOAT16, {0, 64}, FP8KIT_E4M3, true, true, history_len, seed + 13));
  v.push_back(make_member(FP8KIT_BFLOAT16, {1, 4096}, FP8KIT_E5M2, true, true, history_len, seed + 14));
  v.push_back(make_member(FP8KIT_BFLOAT16, {4096}, FP8KIT_E4M3, true, false, history_len, seed + 15));
  return v;
}

// The reference: fp8kit_quantize, then fp8kit_delayed_scaling_update with
// max(entry amax, tensor amax) as the newest amax, on the CPU.
MemberResult composed(const Member& m, const fp8kit_delayed_scaling_config& c) {
  qtest::QuantSpec s = m.spec;
  s.scale = m.scale;
  const qtest::QuantResult q = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, m.input);
  EXPECT_EQ(q.status, FP8KIT_OK) << q.error;
  MemberResult r;
  r.data = q.data;
  r.data_t = q.data_t;
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
  return r;
}

void expect_same(const MemberResult& a, const MemberResult& b, const std::string& what) {
  EXPECT_EQ(a.data, b.data) << what << ": rowwise data";
  EXPECT_EQ(a.data_t, b.data_t) << what << ": columnwise data";
  EXPECT_TRUE(qtest::same_float(a.out_scale_inv, b.out_scale_inv))
      << what << ": scale_inv of the quantization " << a.out_scale_inv << " vs " << b.out_scale_inv;
  ASSERT_EQ(a.history.size(), b.history.size()) << what;
  for (size_t i = 0; i < a.history.size(); ++i) {
    ASSERT_EQ(qtest::float_bits(a.history[i]), qtest::float_bits(b.history[i]))
        << what << ": history[" << i << "] " << a.history[i] << " vs " << b.history[i];
  }
  EXPECT_EQ(qtest::float_bits(a.scale), qtest::float_bits(b.scale)) << what << ": scale";
  EXPECT_EQ(qtest::float_bits(a.scale_inv), qtest::float_bits(b.scale_inv)) << what << ": scale_inv";
  EXPECT_EQ(qtest::float_bits(a.amax), qtest::float_bits(b.amax)) << what << ": amax accumulator";
  EXPECT_EQ(a.counter, b.counter) << what << ": counter";
}

const fp8kit_delayed_scaling_config kConfigs[] = {
    {1, 0, FP8KIT_AMAX_MAX}, {16, 1, FP8KIT_AMAX_MAX}, {16, 0, FP8KIT_AMAX_MOST_RECENT},
    {300, -2, FP8KIT_AMAX_MAX}};

TEST(QuantizeDelayedUpdate, CpuEqualsQuantizeThenUpdate) {
  uint32_t seed = 1;
  for (const auto& c : kConfigs) {
    std::vector<Member> members = mixed_members(c.history_len, seed);
    seed += 100;
    members.back().input = qtest::encode_input(
        qtest::random_values(4096, 2.0f, 9, false, /*nan=*/true), FP8KIT_BFLOAT16);
    FusedRun run(FP8KIT_DEVICE_CPU, members, c);
    ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
    const std::vector<MemberResult> got = run.results();
    for (size_t i = 0; i < members.size(); ++i) {
      expect_same(composed(members[i], c), got[i],
                  "len " + std::to_string(c.history_len) + " member " + std::to_string(i));
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
  const std::vector<int64_t> shape = {8, 8};
  fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, x.data());
  fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, q.data());
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  fp8kit_delayed_quantize_state st{hist, &amax, &scale, &scale_inv, &counter};
  auto expect = [&](fp8kit_tensor* ins, fp8kit_tensor* outs, fp8kit_delayed_quantize_state* sts,
                    int n, const char* needle) {
    EXPECT_EQ(fp8kit_quantize_delayed_update(ins, outs, sts, n, &c, nullptr),
              FP8KIT_INVALID_ARGUMENT) << needle;
    EXPECT_NE(std::string(fp8kit_last_error()).find(needle), std::string::npos)
        << "message: " << fp8kit_last_error() << "\nexpected to contain: " << needle;
  };
  ASSERT_EQ(fp8kit_quantize_delayed_update(&in, &out, &st, 1, &c, nullptr), FP8KIT_OK)
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
  sts[1] = {hist, &amax2, &scale2, &sinv2, &counter2};
  expect(ins, outs, sts, 2, "share buffers");  // one history rolled twice
  expect(&in, &out, &st, 65, "count is 65");
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaQuantizeDelayedUpdate, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 7;
  for (const auto& c : kConfigs) {
    const std::vector<Member> members = mixed_members(c.history_len, seed);
    seed += 100;
    FusedRun cpu(FP8KIT_DEVICE_CPU, members, c), gpu(FP8KIT_DEVICE_CUDA, members, c);
    // Three calls on the same state: the counters and amax accumulators
    // must come back to 0 by themselves, and the scales move on together.
    for (int call = 0; call < 3; ++call) {
      ASSERT_EQ(cpu.call(), FP8KIT_OK) << fp8kit_last_error();
      ASSERT_EQ(gpu.call(), FP8KIT_OK) << fp8kit_last_error();
      const std::vector<MemberResult> a = cpu.results(), b = gpu.results();
      for (size_t i = 0; i < members.size(); ++i) {
        expect_same(a[i], b[i], "len " + std::to_string(c.history_len) + " call " +
                                    std::to_string(call) + " member " + std::to_string(i));
      }
    }
  }
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
