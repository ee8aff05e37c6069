// fp8kit_quantize_delayed_update's column sums, computed by the
// quantization pass (a Linear's bias gradient). CPU: the sums agree with an
// independent float64 sum within float32 rounding, NaN comes out as the
// dtype's canonical NaN, asking for sums leaves the quantization and the
// state exactly as a call without them leaves them, in both recording
// modes, and the sums do not depend on the mode; counters end at 0,
// errors. CUDA == CPU bit for bit (sums, data, state, counters) over
// tile-border shapes, every input and output dtype, a call that mixes
// tensors with and without sums, and three calls in a row (the middle one
// not recorded).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

struct Case {
  fp8kit_dtype in_dtype;
  std::vector<int64_t> shape;
  bool rowwise;          // the columnwise copy is always written
  fp8kit_dtype fp8;
  bool with_sums;
  fp8kit_dtype sums_dtype;
  uint32_t seed;
  std::vector<uint8_t> input;
};

Case make_case(fp8kit_dtype in_dtype, std::vector<int64_t> shape, bool rowwise, fp8kit_dtype fp8,
               bool with_sums, fp8kit_dtype sums_dtype, uint32_t seed, bool nan = false) {
  Case c{in_dtype, std::move(shape), rowwise, fp8, with_sums, sums_dtype, seed, {}};
  const size_t n = size_t(qtest::numel(c.shape));
  c.input = qtest::encode_input(qtest::random_values(n, 1.0f + float(seed % 5), seed, false, nan),
                                in_dtype);
  return c;
}

size_t sums_bytes(const Case& c) {
  return size_t(qtest::flat2d(c.shape).second) * (c.sums_dtype == FP8KIT_FLOAT32 ? 4 : 2);
}

// What a call left behind, per case.
struct Result {
  std::vector<uint8_t> data, columnwise, sums, counters;
  float scale = 0.0f, amax = -1.0f;
};

// Device buffers of every case, kept across calls (state, counters).
class SumsRun {
 public:
  SumsRun(fp8kit_device_type dev, std::vector<Case> cases) : dev_(dev), cases_(std::move(cases)) {
    for (const Case& c : cases_) {
      const auto [rows, cols] = qtest::flat2d(c.shape);
      const size_t n = size_t(rows * cols);
      Buffers b;
      b.in = buf(c.input.size());
      b.in->upload(c.input.data(), c.input.size());
      b.out = buf(n);
      b.columnwise = buf(n);
      b.scale_inv = buf(4);
      b.hist = buf(16 * 4);
      const std::vector<float> hist(16, 2.0f + float(c.seed % 3));
      b.hist->upload(hist.data(), hist.size() * 4);
      b.amax = buf(4);
      b.amax->set_float(0.0f);
      b.scale = buf(4);
      b.scale->set_float(0.5f * float(1 + c.seed % 7));
      b.state_scale_inv = buf(4);
      b.counter = buf(4);
      const unsigned zero = 0;
      b.counter->upload(&zero, 4);
      b.sums = buf(sums_bytes(c));
      b.partials = buf(size_t(fp8kit_column_sums_workspace(rows, cols)) * 4);
      b.tile_counters = buf(size_t((cols + 127) / 128) * 4);
      const std::vector<uint8_t> zeros(size_t((cols + 127) / 128) * 4, 0);
      b.tile_counters->upload(zeros.data(), zeros.size());
      bufs_.push_back(std::move(b));
    }
  }

  fp8kit_status call(bool with_sums = true, int record = 1) {
    std::vector<fp8kit_tensor> in, out;
    std::vector<fp8kit_delayed_quantize_state> st;
    std::vector<fp8kit_column_sums> sums;
    for (size_t i = 0; i < cases_.size(); ++i) {
      const Case& c = cases_[i];
      Buffers& b = bufs_[i];
      in.push_back(qtest::make_tensor(dev_, c.in_dtype, c.shape, b.in->ptr()));
      fp8kit_tensor o = qtest::make_tensor(dev_, c.fp8, c.shape, c.rowwise ? b.out->ptr() : nullptr);
      o.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
      o.columnwise_data = b.columnwise->ptr();
      o.scale_inv = b.scale_inv->fptr();
      out.push_back(o);
      st.push_back({b.hist->fptr(), b.amax->fptr(), b.scale->fptr(), b.state_scale_inv->fptr(),
                    static_cast<unsigned*>(b.counter->ptr()), nullptr});
      fp8kit_column_sums s{};
      if (c.with_sums) {
        s = {b.sums->ptr(), c.sums_dtype, b.partials->fptr(),
             static_cast<unsigned*>(b.tile_counters->ptr())};
      }
      sums.push_back(s);
    }
    const fp8kit_delayed_scaling_config config{16, 0, FP8KIT_AMAX_MAX};
    return fp8kit_quantize_delayed_update(in.data(), out.data(), st.data(),
                                          with_sums ? sums.data() : nullptr, int(st.size()),
                                          &config, record, nullptr);
  }

  std::vector<Result> results() {
    std::vector<Result> r(cases_.size());
    for (size_t i = 0; i < cases_.size(); ++i) {
      const Case& c = cases_[i];
      Buffers& b = bufs_[i];
      const auto [rows, cols] = qtest::flat2d(c.shape);
      if (c.rowwise) r[i].data = b.out->download(size_t(rows * cols));
      r[i].columnwise = b.columnwise->download(size_t(rows * cols));
      if (c.with_sums) {
        r[i].sums = b.sums->download(sums_bytes(c));
        r[i].counters = b.tile_counters->download(size_t((cols + 127) / 128) * 4);
      }
      r[i].scale = b.scale->get_float();
      r[i].amax = b.amax->get_float();
    }
    return r;
  }

 private:
  struct Buffers {
    std::unique_ptr<qtest::Buffer> in, out, columnwise, scale_inv, hist, amax, scale,
        state_scale_inv, counter, sums, partials, tile_counters;
  };
  std::unique_ptr<qtest::Buffer> buf(size_t bytes) {
    return std::make_unique<qtest::Buffer>(dev_, bytes);
  }
  fp8kit_device_type dev_;
  std::vector<Case> cases_;
  std::vector<Buffers> bufs_;
};

TEST(ColumnSums, CpuMatchesFloat64WithinRounding) {
  const fp8kit_dtype dtypes[] = {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16};
  uint32_t seed = 3;
  for (fp8kit_dtype in_dtype : dtypes) {
    for (fp8kit_dtype out_dtype : dtypes) {
      const Case c = make_case(in_dtype, {3, 100, 77}, true, FP8KIT_E5M2, true, out_dtype, seed++);
      SumsRun run(FP8KIT_DEVICE_CPU, {c});
      ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
      const Result r = run.results()[0];
      const auto [rows, cols] = qtest::flat2d(c.shape);
      // float32 adds over `rows` terms: error <= rows * 2^-24 * sum |x|,
      // plus the output dtype's own rounding of the result.
      const double out_eps = out_dtype == FP8KIT_FLOAT32 ? 0.0 : out_dtype == FP8KIT_BFLOAT16
                                                                    ? 1.0 / 256 : 1.0 / 2048;
      for (int64_t col = 0; col < cols; ++col) {
        double want = 0.0, abs_sum = 0.0;
        for (int64_t row = 0; row < rows; ++row) {
          const double v = qtest::input_value(c.input, in_dtype, size_t(row * cols + col));
          want += v;
          abs_sum += std::fabs(v);
        }
        const double got = qtest::input_value(r.sums, out_dtype, size_t(col));
        const double tol = double(rows) * std::ldexp(1.0, -24) * abs_sum +
                           out_eps * std::fabs(want) + 1e-30;
        ASSERT_NEAR(got, want, tol) << "column " << col << " in " << fp8kit_dtype_name(in_dtype)
                                    << " out " << fp8kit_dtype_name(out_dtype);
      }
      EXPECT_EQ(r.counters, std::vector<uint8_t>(r.counters.size(), 0)) << "counters back to 0";
    }
  }
}

TEST(ColumnSums, WorkedExampleAndNaN) {
  // [3, 2] float32: column 0 sums to 1.5 + -6 + 0.25, column 1 holds a NaN.
  Case c{FP8KIT_FLOAT32, {3, 2}, true, FP8KIT_E4M3, true, FP8KIT_BFLOAT16, 1,
         qtest::encode_input({1.5f, 3.0f, -6.0f, NAN, 0.25f, 1.0f}, FP8KIT_FLOAT32)};
  SumsRun run(FP8KIT_DEVICE_CPU, {c});
  ASSERT_EQ(run.call(), FP8KIT_OK) << fp8kit_last_error();
  const Result r = run.results()[0];
  EXPECT_EQ(qtest::input_value(r.sums, FP8KIT_BFLOAT16, 0), -4.25f);
  uint16_t nan_bits;
  std::memcpy(&nan_bits, &r.sums[2], 2);
  EXPECT_EQ(nan_bits, 0x7fc0) << "canonical bfloat16 NaN";
}

TEST(ColumnSums, QuantizationAndStateUnchangedBySumsInBothModes) {
  const std::vector<Case> with = {
      make_case(FP8KIT_BFLOAT16, {300, 200}, true, FP8KIT_E5M2, true, FP8KIT_BFLOAT16, 11),
      make_case(FP8KIT_FLOAT32, {129, 130}, false, FP8KIT_E4M3, true, FP8KIT_FLOAT32, 12)};
  std::vector<Case> without = with;
  for (Case& c : without) c.with_sums = false;
  std::vector<Result> sums_by_mode[2];
  for (int record : {1, 0}) {
    SumsRun a(FP8KIT_DEVICE_CPU, with), b(FP8KIT_DEVICE_CPU, without);
    ASSERT_EQ(a.call(true, record), FP8KIT_OK) << fp8kit_last_error();
    ASSERT_EQ(b.call(/*with_sums=*/false, record), FP8KIT_OK) << fp8kit_last_error();
    const std::vector<Result> ra = a.results(), rb = b.results();
    for (size_t i = 0; i < with.size(); ++i) {
      const std::string what = "record " + std::to_string(record) + " case " + std::to_string(i);
      EXPECT_EQ(ra[i].data, rb[i].data) << what;
      EXPECT_EQ(ra[i].columnwise, rb[i].columnwise) << what;
      EXPECT_EQ(qtest::float_bits(ra[i].scale), qtest::float_bits(rb[i].scale)) << what;
      EXPECT_EQ(ra[i].amax, 0.0f) << what;
      EXPECT_EQ(ra[i].counters, std::vector<uint8_t>(ra[i].counters.size(), 0)) << what;
    }
    sums_by_mode[record] = ra;
  }
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(sums_by_mode[0][i].sums, sums_by_mode[1][i].sums) << "case " << i;
  }
}

TEST(ColumnSums, Errors) {
  auto expect = [](Case c, bool columnwise, const char* needle,
                   void (*edit)(fp8kit_column_sums*)) {
    const auto [rows, cols] = qtest::flat2d(c.shape);
    std::vector<uint8_t> q(size_t(rows * cols)), qt(size_t(rows * cols)), sums(size_t(cols) * 4);
    std::vector<float> partials(size_t(fp8kit_column_sums_workspace(rows, cols)) + 1);
    std::vector<unsigned> counters(size_t((cols + 127) / 128) + 1, 0u);
    float hist[16] = {}, amax = 0, scale = 1, scale_inv = 0, out_scale_inv = 0;
    unsigned counter = 0;
    fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, c.in_dtype, c.shape, c.input.data());
    fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, c.fp8, c.shape, q.data());
    out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    out.columnwise_data = columnwise ? qt.data() : nullptr;
    out.scale_inv = &out_scale_inv;
    fp8kit_delayed_quantize_state st{hist, &amax, &scale, &scale_inv, &counter, nullptr};
    fp8kit_column_sums s{sums.data(), c.sums_dtype, partials.data(), counters.data()};
    if (edit != nullptr) edit(&s);
    const fp8kit_delayed_scaling_config config{16, 0, FP8KIT_AMAX_MAX};
    EXPECT_EQ(fp8kit_quantize_delayed_update(&in, &out, &st, &s, 1, &config, 1, nullptr),
              FP8KIT_INVALID_ARGUMENT) << needle;
    EXPECT_NE(std::string(fp8kit_last_error()).find(needle), std::string::npos)
        << "message: " << fp8kit_last_error() << "\nexpected to contain: " << needle;
  };
  const Case ok = make_case(FP8KIT_FLOAT32, {8, 8}, true, FP8KIT_E4M3, true, FP8KIT_FLOAT32, 1);
  expect(ok, false, "needs outputs[0].columnwise_data", nullptr);
  expect(make_case(FP8KIT_FLOAT32, {1, 64}, true, FP8KIT_E4M3, true, FP8KIT_FLOAT32, 2), true,
         "rows > 1 and cols > 1", nullptr);
  expect(ok, true, "column sums are float32, bfloat16 or float16",
         [](fp8kit_column_sums* s) { s->dtype = FP8KIT_E4M3; });
  expect(ok, true, "NULL partials or counters",
         [](fp8kit_column_sums* s) { s->partials = nullptr; });
  EXPECT_EQ(fp8kit_column_sums_workspace(300, 7), 3 * 7);
  EXPECT_EQ(fp8kit_column_sums_workspace(0, 7), 0);
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaColumnSums, MatchCpuBitForBit) {
  QTEST_SKIP_WITHOUT_GPU();
  // Tile borders in both directions, every dtype pair, one tensor without
  // sums in the same call (a launch of its own), NaN in one input.
  const std::vector<Case> cases = {
      make_case(FP8KIT_BFLOAT16, {1000, 300}, true, FP8KIT_E5M2, true, FP8KIT_BFLOAT16, 21),
      make_case(FP8KIT_BFLOAT16, {2, 1024}, true, FP8KIT_E5M2, true, FP8KIT_FLOAT32, 22),
      make_case(FP8KIT_FLOAT32, {257, 130}, false, FP8KIT_E4M3, true, FP8KIT_FLOAT16, 23),
      make_case(FP8KIT_FLOAT16, {5, 3, 1000}, true, FP8KIT_E4M3, true, FP8KIT_BFLOAT16, 24, true),
      make_case(FP8KIT_BFLOAT16, {4096, 256}, true, FP8KIT_E5M2, true, FP8KIT_BFLOAT16, 25),
      make_case(FP8KIT_BFLOAT16, {384, 128}, true, FP8KIT_E5M2, false, FP8KIT_BFLOAT16, 26),
      // 18 row tiles: the finish's loads come 16 at a time, then 2 more.
      make_case(FP8KIT_BFLOAT16, {2200, 200}, true, FP8KIT_E5M2, true, FP8KIT_FLOAT32, 27)};
  SumsRun cpu(FP8KIT_DEVICE_CPU, cases), gpu(FP8KIT_DEVICE_CUDA, cases);
  for (int call = 0; call < 3; ++call) {  // the tile counters must reset themselves
    const int record = call == 1 ? 0 : 1;   // sums in both modes
    ASSERT_EQ(cpu.call(true, record), FP8KIT_OK) << fp8kit_last_error();
    ASSERT_EQ(gpu.call(true, record), FP8KIT_OK) << fp8kit_last_error();
    const std::vector<Result> a = cpu.results(), b = gpu.results();
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string what = "call " + std::to_string(call) + " case " + std::to_string(i);
      EXPECT_EQ(a[i].sums, b[i].sums) << what << ": column sums";
      EXPECT_EQ(b[i].counters, std::vector<uint8_t>(b[i].counters.size(), 0)) << what;
      EXPECT_EQ(a[i].data, b[i].data) << what;
      EXPECT_EQ(a[i].columnwise, b[i].columnwise) << what;
      EXPECT_EQ(qtest::float_bits(a[i].scale), qtest::float_bits(b[i].scale)) << what;
    }
  }
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
