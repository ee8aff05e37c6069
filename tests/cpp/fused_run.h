// Runner of fp8kit_quantize_delayed_update for the tests: members (input,
// what to produce, scaling state), device buffers kept across calls so
// that state carries from one call to the next, and a comparison of
// everything a call leaves behind.
#ifndef FP8KIT_TESTS_CPP_FUSED_RUN_H_
#define FP8KIT_TESTS_CPP_FUSED_RUN_H_

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace fused {

// One tensor of a call: its input and what to produce, and the state.
struct Member {
  qtest::QuantSpec spec;
  std::vector<uint8_t> input;
  std::vector<float> history;
  float amax = 0.0f;   // accumulator on entry
  float scale = 1.0f;
  float seeded = -1;     // the state's flag on entry; -1: no flag (NULL)
};

// What a call left behind, per member.
struct MemberResult {
  std::vector<uint8_t> data, columnwise;
  float out_scale_inv = -1.0f;
  std::vector<float> history;
  float amax = -1.0f, scale = -1.0f, scale_inv = -1.0f;
  unsigned int counter = 1234u;
  float seeded = -1;
};

inline std::vector<float> floats_of(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  if (!f.empty()) std::memcpy(f.data(), b.data(), b.size());
  return f;
}

class FusedRun {
 public:
  FusedRun(fp8kit_device_type dev, std::vector<Member> members,
           const fp8kit_delayed_scaling_config& config)
      : dev_(dev), members_(std::move(members)), config_(config) {
    for (const Member& m : members_) {
      const size_t n = size_t(qtest::numel(m.spec.shape));
      Buffers b;
      b.in = buf(m.input.size());
      b.in->upload(m.input.data(), m.input.size());
      b.out = buf(n);
      b.columnwise = buf(n);
      b.out_scale_inv = buf(4);
      b.hist = buf(m.history.size() * 4);
      b.hist->upload(m.history.data(), m.history.size() * 4);
      b.amax = buf(4);
      b.amax->set_float(m.amax);
      b.scale = buf(4);
      b.scale->set_float(m.scale);
      b.scale_inv = buf(4);
      b.scale_inv->set_float(-3.0f);
      b.counter = buf(4);
      const unsigned int zero = 0;
      b.counter->upload(&zero, 4);
      b.seeded = buf(4);
      b.seeded->upload(&m.seeded, 4);
      bufs_.push_back(std::move(b));
    }
  }

  fp8kit_status call(int record = 1) {
    std::vector<fp8kit_tensor> in, out;
    std::vector<fp8kit_delayed_quantize_state> st;
    for (size_t i = 0; i < members_.size(); ++i) {
      const qtest::QuantSpec& s = members_[i].spec;
      Buffers& b = bufs_[i];
      in.push_back(qtest::make_tensor(dev_, s.in_dtype, s.shape, b.in->ptr()));
      fp8kit_tensor o = qtest::make_tensor(dev_, s.fp8, s.shape, s.rowwise ? b.out->ptr() : nullptr);
      o.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
      o.columnwise_data = s.columnwise ? b.columnwise->ptr() : nullptr;
      o.scale_inv = b.out_scale_inv->fptr();
      out.push_back(o);
      float* seeded = members_[i].seeded < 0 ? nullptr : static_cast<float*>(b.seeded->ptr());
      st.push_back({b.hist->fptr(), b.amax->fptr(), b.scale->fptr(), b.scale_inv->fptr(),
                    static_cast<unsigned int*>(b.counter->ptr()), seeded});
    }
    return fp8kit_quantize_delayed_update(in.data(), out.data(), st.data(), nullptr,
                                          int(st.size()), &config_, record, nullptr);
  }

  std::vector<MemberResult> results() {
    std::vector<MemberResult> r(members_.size());
    for (size_t i = 0; i < members_.size(); ++i) {
      const qtest::QuantSpec& s = members_[i].spec;
      Buffers& b = bufs_[i];
      const size_t n = size_t(qtest::numel(s.shape));
      if (s.rowwise) r[i].data = b.out->download(n);
      if (s.columnwise) r[i].columnwise = b.columnwise->download(n);
      r[i].out_scale_inv = b.out_scale_inv->get_float();
      r[i].history = floats_of(b.hist->download(members_[i].history.size() * 4));
      r[i].amax = b.amax->get_float();
      r[i].scale = b.scale->get_float();
      r[i].scale_inv = b.scale_inv->get_float();
      std::memcpy(&r[i].counter, b.counter->download(4).data(), 4);
      std::memcpy(&r[i].seeded, b.seeded->download(4).data(), 4);
    }
    return r;
  }

 private:
  struct Buffers {
    std::unique_ptr<qtest::Buffer> in, out, columnwise, out_scale_inv, hist, amax, scale,
        scale_inv, counter, seeded;
  };
  std::unique_ptr<qtest::Buffer> buf(size_t bytes) {
    return std::make_unique<qtest::Buffer>(dev_, bytes);
  }
  fp8kit_device_type dev_;
  std::vector<Member> members_;
  fp8kit_delayed_scaling_config config_;
  std::vector<Buffers> bufs_;
};

inline Member make_member(fp8kit_dtype in_dtype, std::vector<int64_t> shape, fp8kit_dtype fp8,
                   bool rowwise, bool columnwise, int amax_history_len, uint32_t seed) {
  Member m;
  m.spec.in_dtype = in_dtype;
  m.spec.shape = std::move(shape);
  m.spec.fp8 = fp8;
  m.spec.rowwise = rowwise;
  m.spec.columnwise = columnwise;
  const size_t n = size_t(qtest::numel(m.spec.shape));
  m.input = qtest::encode_input(qtest::random_values(n, 1.0f + float(seed % 7), seed, seed % 3 == 0),
                                in_dtype);
  for (int i = 0; i < amax_history_len; ++i) m.history.push_back(float((seed * 31 + i * 17) % 97) / 9.0f);
  m.scale = 0.25f * float(1 + seed % 13);
  m.amax = seed % 4 == 1 ? 3.5f : 0.0f;  // sometimes an amax already accumulated
  return m;
}

// The members the CUDA tests use: every cast kind, odd and empty shapes,
// all three input dtypes, both formats; 6 bf16 rowwise+columnwise tensors (more than
// one launch's 4) so the grouping splits.
inline std::vector<Member> mixed_members(int amax_history_len, uint32_t seed) {
  std::vector<Member> v;
  for (int i = 0; i < 6; ++i) {
    v.push_back(make_member(FP8KIT_BFLOAT16, {int64_t(16 + 100 * i), 1024}, FP8KIT_E4M3, true,
                            true, amax_history_len, seed + uint32_t(i)));
  }
  v.push_back(make_member(FP8KIT_BFLOAT16, {333, 77}, FP8KIT_E4M3, true, true, amax_history_len, seed + 10));
  v.push_back(make_member(FP8KIT_FLOAT32, {257, 130}, FP8KIT_E5M2, false, true, amax_history_len, seed + 11));
  v.push_back(make_member(FP8KIT_FLOAT16, {5, 3, 1000}, FP8KIT_E4M3, true, false, amax_history_len, seed + 12));
  v.push_back(make_member(FP8KIT_BFLOAT16, {0, 64}, FP8KIT_E4M3, true, true, amax_history_len, seed + 13));
  v.push_back(make_member(FP8KIT_BFLOAT16, {1, 4096}, FP8KIT_E5M2, true, true, amax_history_len, seed + 14));
  v.push_back(make_member(FP8KIT_BFLOAT16, {4096}, FP8KIT_E4M3, true, false, amax_history_len, seed + 15));
  return v;
}

// Bit-for-bit equality of everything two calls left behind.
inline void expect_same(const MemberResult& a, const MemberResult& b, const std::string& what) {
  EXPECT_EQ(a.data, b.data) << what << ": rowwise data";
  EXPECT_EQ(a.columnwise, b.columnwise) << what << ": columnwise data";
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
  EXPECT_EQ(a.seeded, b.seeded) << what << ": seeded";
}

}  // namespace fused

#endif  // FP8KIT_TESTS_CPP_FUSED_RUN_H_
