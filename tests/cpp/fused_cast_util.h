// Helpers of the fused-op tests (normalization, activations): the buffers
// of one fused cast (FP8 output, scaling state, column sums) on the CPU or
// a GPU, what a call left in them, and the reference: the same cast done
// by fp8kit_quantize_delayed_update / fp8kit_quantize_current_scaling on a
// float32 tensor, which fp8kit/fused_cast.h says the fused result equals
// bit for bit.
#ifndef FP8KIT_TESTS_CPP_FUSED_CAST_UTIL_H_
#define FP8KIT_TESTS_CPP_FUSED_CAST_UTIL_H_

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace fusedtest {

// One fused cast: recipe, copies, state on entry.
struct CastSpec {
  bool current = false;
  fp8kit_dtype fp8 = FP8KIT_E4M3;
  bool rowwise = true, columnwise = true;
  // Delayed scaling.
  std::vector<float> history = {3.0f, 1.5f, 0.25f};
  float amax = 0.0f;     // accumulator on entry
  float scale = 2.0f;
  float seeded = -1.0f;  // -1: no flag (NULL)
  int record = 1;
  fp8kit_delayed_scaling_config delayed{3, 0, FP8KIT_AMAX_MAX};
  // Current scaling.
  fp8kit_current_scaling_config config{0.0f, 0};
  // Column sums (the ops that take them).
  bool sums = false;
  fp8kit_dtype sums_dtype = FP8KIT_FLOAT32;
};

// Everything a cast leaves behind.
struct CastResult {
  std::vector<uint8_t> data, columnwise, sums, sums_counters;
  float out_scale = 0, out_scale_inv = 0, out_amax = 0;
  std::vector<float> history;
  float amax = 0, scale = 0, scale_inv = 0, seeded = 0;
  unsigned int counter = 0;
};

inline void expect_same_cast(const CastResult& a, const CastResult& b, const std::string& what) {
  EXPECT_EQ(a.data, b.data) << what << ": rowwise FP8";
  EXPECT_EQ(a.columnwise, b.columnwise) << what << ": columnwise FP8";
  EXPECT_EQ(a.sums, b.sums) << what << ": column sums";
  EXPECT_EQ(a.sums_counters, b.sums_counters) << what << ": column-sum counters";
  EXPECT_EQ(qtest::float_bits(a.out_scale), qtest::float_bits(b.out_scale)) << what << ": scale";
  EXPECT_EQ(qtest::float_bits(a.out_scale_inv), qtest::float_bits(b.out_scale_inv))
      << what << ": scale_inv";
  EXPECT_EQ(qtest::float_bits(a.out_amax), qtest::float_bits(b.out_amax)) << what << ": amax";
  ASSERT_EQ(a.history.size(), b.history.size()) << what;
  for (size_t i = 0; i < a.history.size(); ++i) {
    EXPECT_EQ(qtest::float_bits(a.history[i]), qtest::float_bits(b.history[i]))
        << what << ": history[" << i << "]";
  }
  EXPECT_EQ(qtest::float_bits(a.amax), qtest::float_bits(b.amax)) << what << ": state amax";
  EXPECT_EQ(qtest::float_bits(a.scale), qtest::float_bits(b.scale)) << what << ": state scale";
  EXPECT_EQ(qtest::float_bits(a.scale_inv), qtest::float_bits(b.scale_inv))
      << what << ": state scale_inv";
  EXPECT_EQ(qtest::float_bits(a.seeded), qtest::float_bits(b.seeded)) << what << ": seeded";
  EXPECT_EQ(a.counter, b.counter) << what << ": counter";
}

// The buffers of one cast of a [rows, cols] tensor on `dev`; they keep
// their contents across calls, so state carries from one call to the next.
class CastBuffers {
 public:
  CastBuffers(fp8kit_device_type dev, const CastSpec& spec, std::vector<int64_t> shape)
      : dev_(dev), spec_(spec), shape_(std::move(shape)) {
    std::tie(rows_, cols_) = qtest::flat2d(shape_);
    const size_t n = size_t(rows_ * cols_);
    data_ = buf(n);
    columnwise_ = buf(n);
    out_scale_ = scalar(-7.0f);
    out_scale_inv_ = scalar(-7.0f);
    out_amax_ = scalar(-7.0f);
    history_ = buf(spec.history.size() * 4);
    history_->upload(spec.history.data(), spec.history.size() * 4);
    amax_ = scalar(spec.amax);
    scale_ = scalar(spec.scale);
    scale_inv_ = scalar(-3.0f);
    counter_ = scalar(0.0f);
    seeded_ = scalar(spec.seeded);
    const size_t tiles_c = size_t((cols_ + 127) / 128);
    sums_ = buf(size_t(cols_) * fp8kit_dtype_size(spec.sums_dtype));
    partials_ = buf(size_t(fp8kit_column_sums_workspace(rows_, cols_)) * 4);
    counters_ = buf(tiles_c * 4);
    counters_->upload(std::vector<uint8_t>(tiles_c * 4, 0).data(), tiles_c * 4);
  }

  fp8kit_tensor out() {
    fp8kit_tensor t = qtest::make_tensor(dev_, spec_.fp8, shape_, spec_.rowwise ? data_->ptr() : nullptr);
    t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    t.columnwise_data = spec_.columnwise ? columnwise_->ptr() : nullptr;
    t.scale_inv = out_scale_inv_->fptr();
    if (spec_.current) {
      t.scale = out_scale_->fptr();
      t.amax = out_amax_->fptr();
    }
    return t;
  }

  fp8kit_delayed_quantize_state state() {
    return {history_->fptr(), amax_->fptr(), scale_->fptr(), scale_inv_->fptr(),
            static_cast<unsigned int*>(counter_->ptr()),
            spec_.seeded < 0 ? nullptr : seeded_->fptr()};
  }

  fp8kit_fused_cast cast() {
    fp8kit_fused_cast c{};
    c.recipe = spec_.current ? FP8KIT_FUSED_CAST_CURRENT : FP8KIT_FUSED_CAST_DELAYED;
    c.state = state();
    c.delayed_config = spec_.delayed;
    c.record = spec_.record;
    c.current_config = spec_.config;
    return c;
  }

  // NULL unless the spec asks for sums.
  const fp8kit_column_sums* sums() {
    sums_desc_ = {sums_->ptr(), spec_.sums_dtype, partials_->fptr(),
                  static_cast<unsigned int*>(counters_->ptr())};
    return spec_.sums ? &sums_desc_ : nullptr;
  }

  CastResult result() {
    CastResult r;
    const size_t n = size_t(rows_ * cols_);
    if (spec_.rowwise) r.data = data_->download(n);
    if (spec_.columnwise) r.columnwise = columnwise_->download(n);
    if (spec_.sums) {
      r.sums = sums_->download(size_t(cols_) * fp8kit_dtype_size(spec_.sums_dtype));
      r.sums_counters = counters_->download(size_t((cols_ + 127) / 128) * 4);
    }
    r.out_scale = out_scale_->get_float();
    r.out_scale_inv = out_scale_inv_->get_float();
    r.out_amax = out_amax_->get_float();
    std::vector<uint8_t> h = history_->download(spec_.history.size() * 4);
    r.history.resize(spec_.history.size());
    if (!h.empty()) std::memcpy(r.history.data(), h.data(), h.size());
    r.amax = amax_->get_float();
    r.scale = scale_->get_float();
    r.scale_inv = scale_inv_->get_float();
    r.seeded = seeded_->get_float();
    std::memcpy(&r.counter, counter_->download(4).data(), 4);
    return r;
  }

 private:
  std::unique_ptr<qtest::Buffer> buf(size_t bytes) {
    return std::make_unique<qtest::Buffer>(dev_, bytes);
  }
  std::unique_ptr<qtest::Buffer> scalar(float v) {
    auto b = buf(4);
    b->set_float(v);
    return b;
  }
  fp8kit_device_type dev_;
  CastSpec spec_;
  std::vector<int64_t> shape_;
  int64_t rows_ = 0, cols_ = 0;
  std::unique_ptr<qtest::Buffer> data_, columnwise_, out_scale_, out_scale_inv_, out_amax_,
      history_, amax_, scale_, scale_inv_, counter_, seeded_, sums_, partials_, counters_;
  fp8kit_column_sums sums_desc_{};
};

// The reference: `values` (float32, `shape`) cast on the CPU by the two
// quantize functions with the state `spec` describes.
inline CastResult reference_cast(const CastSpec& spec, const std::vector<int64_t>& shape,
                                 std::vector<float> values) {
  CastBuffers b(FP8KIT_DEVICE_CPU, spec, shape);
  fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, shape, values.data());
  fp8kit_tensor out = b.out();
  fp8kit_status st;
  if (spec.current) {
    st = fp8kit_quantize_current_scaling(&in, &out, &spec.config, b.sums(), nullptr);
  } else {
    const fp8kit_delayed_quantize_state s = b.state();
    st = fp8kit_quantize_delayed_update(&in, &out, &s, b.sums(), 1, &spec.delayed, spec.record,
                                        nullptr);
  }
  EXPECT_EQ(st, FP8KIT_OK) << fp8kit_last_error();
  return b.result();
}

// The cast specs every fused op is tested with: delayed with a seeded slot
// (flag and no flag), a fresh slot, recording or not, current scaling
// (plain and power-of-two), both formats.
inline std::vector<CastSpec> cast_specs() {
  std::vector<CastSpec> v;
  CastSpec d;
  v.push_back(d);                      // delayed, no flag, record
  d.seeded = 0.0f;
  v.push_back(d);                      // fresh slot, record
  d.record = 0;
  v.push_back(d);                      // fresh slot, no record
  d.seeded = 1.0f;
  d.fp8 = FP8KIT_E5M2;
  d.amax = 5.0f;                       // an amax already accumulated
  v.push_back(d);                      // seeded, no record, E5M2
  d.record = 1;
  d.rowwise = false;
  d.delayed = {3, 2, FP8KIT_AMAX_MOST_RECENT};
  v.push_back(d);                      // seeded, record, columnwise only
  CastSpec c;
  c.current = true;
  v.push_back(c);
  c.config = {1e-3f, 1};
  c.fp8 = FP8KIT_E5M2;
  c.columnwise = false;
  v.push_back(c);                      // power of two, rowwise only
  return v;
}

inline std::string spec_name(const CastSpec& s) {
  if (s.current) return std::string("current ") + fp8kit_dtype_name(s.fp8);
  return std::string("delayed seeded=") + std::to_string(int(s.seeded)) +
         " record=" + std::to_string(s.record) + " " + fp8kit_dtype_name(s.fp8);
}

// Bytes of a float32 tensor rounded to `dtype` by the tests' own rounding
// (canonical NaN).
inline std::vector<uint8_t> rounded_bytes(const std::vector<float>& v, fp8kit_dtype dtype) {
  std::vector<float> c = v;
  for (float& x : c) {
    if (std::isnan(x)) x = qtest::bits_float(0x7fc00000u);
  }
  return qtest::encode_input(c, dtype);
}

// A test error: `status` is INVALID_ARGUMENT and the message names `arg`.
inline void expect_names(fp8kit_status status, const std::string& arg, const std::string& what) {
  EXPECT_EQ(status, FP8KIT_INVALID_ARGUMENT) << what;
  const std::string msg = fp8kit_last_error();
  EXPECT_NE(msg.find(arg), std::string::npos) << what << ": message \"" << msg
                                              << "\" does not name " << arg;
}

}  // namespace fusedtest

#endif  // FP8KIT_TESTS_CPP_FUSED_CAST_UTIL_H_
