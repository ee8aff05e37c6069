// fp8kit_dequantize: every FP8 code times several scale_inv values into
// float32 / bfloat16 / float16 against a reference computed here, the
// columnwise copy transposed back, quantize -> dequantize round trips,
// errors, and CUDA == CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

struct DequantSpec {
  fp8kit_dtype fp8 = FP8KIT_E4M3;
  fp8kit_dtype out_dtype = FP8KIT_FLOAT32;
  std::vector<int64_t> shape;
  bool from_columnwise = false;
  float scale_inv = 1.0f;
};

struct DequantResult {
  fp8kit_status status;
  std::string error;
  std::vector<uint8_t> out;
};

// q holds the rowwise bytes (or, from_columnwise, the columnwise bytes).
DequantResult run_dequantize(fp8kit_device_type dev, const DequantSpec& s,
                             const std::vector<uint8_t>& q) {
  const size_t n = size_t(qtest::numel(s.shape));
  const size_t out_bytes = n * fp8kit_dtype_size(s.out_dtype);
  qtest::Buffer in(dev, n), out(dev, out_bytes), si(dev, 4);
  in.upload(q.data(), n);
  si.set_float(s.scale_inv);
  fp8kit_tensor ti = qtest::make_tensor(dev, s.fp8, s.shape, s.from_columnwise ? nullptr : in.ptr());
  ti.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  ti.columnwise_data = s.from_columnwise ? in.ptr() : nullptr;
  ti.scale_inv = si.fptr();
  fp8kit_tensor to = qtest::make_tensor(dev, s.out_dtype, s.shape, out.ptr());
  DequantResult r;
  r.status = fp8kit_dequantize(&ti, &to, s.from_columnwise ? 1 : 0, nullptr);
  r.error = fp8kit_last_error();
  if (r.status == FP8KIT_OK) r.out = out.download(out_bytes);
  return r;
}

// Output bits of one element (16 or 32 bits).
uint32_t out_bits(const std::vector<uint8_t>& out, fp8kit_dtype dtype, size_t i) {
  if (dtype == FP8KIT_FLOAT32) {
    uint32_t b;
    std::memcpy(&b, &out[4 * i], 4);
    return b;
  }
  uint16_t h;
  std::memcpy(&h, &out[2 * i], 2);
  return h;
}

bool is_nan_bits(uint32_t b, fp8kit_dtype dtype) {
  if (dtype == FP8KIT_FLOAT32) return (b & 0x7fffffffu) > 0x7f800000u;
  if (dtype == FP8KIT_BFLOAT16) return (b & 0x7fffu) > 0x7f80u;
  return (b & 0x7fffu) > 0x7c00u;
}

// The reference: the exact product rounded once to float32, then to the
// output type.
uint32_t expected_bits(uint8_t q, fp8kit_dtype fp8, float scale_inv, fp8kit_dtype out) {
  const float v = float(qtest::decode_fp8(q, fp8) * double(scale_inv));
  if (std::isnan(v)) return out == FP8KIT_FLOAT32 ? 0x7fc00000u : out == FP8KIT_BFLOAT16 ? 0x7fc0u : 0x7e00u;
  if (out == FP8KIT_FLOAT32) return qtest::float_bits(v);
  return out == FP8KIT_BFLOAT16 ? qtest::ref_to_bf16(v) : qtest::ref_to_fp16(v);
}

std::vector<uint8_t> all_codes() {
  std::vector<uint8_t> q(256);
  for (int i = 0; i < 256; ++i) q[size_t(i)] = uint8_t(i);
  return q;
}

TEST(Dequantize, EveryCodeMatchesReference) {
  const std::vector<uint8_t> q = all_codes();
  for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
    for (fp8kit_dtype out : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (float si : {1.0f, 0.5f, 1.0f / 3.0f, 1e-3f, 7.0f, 1e30f, 3e-39f}) {
        DequantSpec s;
        s.fp8 = fmt;
        s.out_dtype = out;
        s.shape = {16, 16};
        s.scale_inv = si;
        const DequantResult r = run_dequantize(FP8KIT_DEVICE_CPU, s, q);
        ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
        for (int i = 0; i < 256; ++i) {
          const uint32_t got = out_bits(r.out, out, size_t(i));
          const uint32_t want = expected_bits(uint8_t(i), fmt, si, out);
          if (is_nan_bits(want, out)) {
            EXPECT_TRUE(is_nan_bits(got, out)) << "code " << i;
          } else {
            EXPECT_EQ(got, want) << fp8kit_dtype_name(fmt) << "->" << fp8kit_dtype_name(out)
                                 << " code 0x" << std::hex << i << " scale_inv " << si;
          }
        }
      }
    }
  }
}

TEST(Dequantize, FromColumnwiseTransposesBack) {
  // Quantize a rank-3 tensor with both layouts, then dequantize each.
  qtest::QuantSpec qs;
  qs.shape = {3, 5, 7};
  qs.in_dtype = FP8KIT_FLOAT32;
  qs.scale = 4.0f;
  const std::vector<uint8_t> input =
      qtest::encode_input(qtest::random_values(105, 10.0f, 21, true), FP8KIT_FLOAT32);
  const qtest::QuantResult q = qtest::run_quantize(FP8KIT_DEVICE_CPU, qs, input);
  ASSERT_EQ(q.status, FP8KIT_OK) << q.error;
  DequantSpec s;
  s.shape = qs.shape;
  s.scale_inv = q.scale_inv;
  const DequantResult rowwise = run_dequantize(FP8KIT_DEVICE_CPU, s, q.data);
  s.from_columnwise = true;
  const DequantResult columnwise = run_dequantize(FP8KIT_DEVICE_CPU, s, q.columnwise);
  ASSERT_EQ(rowwise.status, FP8KIT_OK) << rowwise.error;
  ASSERT_EQ(columnwise.status, FP8KIT_OK) << columnwise.error;
  EXPECT_EQ(rowwise.out, columnwise.out);
}

TEST(Dequantize, RoundTripIsWithinHalfAnFp8Step) {
  // Values already on the FP8 grid (times scale_inv) come back exactly;
  // others within half a step (relative 2^-4 for E4M3, 2^-3 for E5M2).
  for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
    qtest::QuantSpec qs;
    qs.shape = {64, 48};
    qs.in_dtype = FP8KIT_FLOAT32;
    qs.fp8 = fmt;
    qs.current = true;
    const std::vector<float> x = qtest::random_values(64 * 48, 1.0f, 77, false);
    const qtest::QuantResult q =
        qtest::run_quantize(FP8KIT_DEVICE_CPU, qs, qtest::encode_input(x, FP8KIT_FLOAT32));
    ASSERT_EQ(q.status, FP8KIT_OK) << q.error;
    DequantSpec s;
    s.fp8 = fmt;
    s.shape = qs.shape;
    s.scale_inv = q.scale_inv;
    const DequantResult d = run_dequantize(FP8KIT_DEVICE_CPU, s, q.data);
    ASSERT_EQ(d.status, FP8KIT_OK) << d.error;
    const double rel = (fmt == FP8KIT_E4M3 ? 0x1p-4 : 0x1p-3) * 1.001;  // float rounding slack
    const double tiny = qtest::decode_fp8(1, fmt) * double(q.scale_inv);  // smallest step
    for (size_t i = 0; i < x.size(); ++i) {
      const float y = qtest::bits_float(out_bits(d.out, FP8KIT_FLOAT32, i));
      EXPECT_LE(std::fabs(double(y) - double(x[i])), std::max(rel * std::fabs(double(x[i])), tiny))
          << i;
      // Re-quantizing the dequantized value gives the same code.
      EXPECT_EQ(qtest::ref_quantize(y, q.scale, fmt), q.data[i]) << i;
    }
  }
}

TEST(Dequantize, EmptyAndRankZero) {
  DequantSpec s;
  s.shape = {};
  s.scale_inv = 2.0f;
  DequantResult r = run_dequantize(FP8KIT_DEVICE_CPU, s, {0x38});  // 1.0
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  EXPECT_EQ(qtest::bits_float(out_bits(r.out, FP8KIT_FLOAT32, 0)), 2.0f);
  s.shape = {0, 4};
  r = run_dequantize(FP8KIT_DEVICE_CPU, s, {});
  EXPECT_EQ(r.status, FP8KIT_OK) << r.error;
}

TEST(Dequantize, Errors) {
  uint8_t q[8] = {};
  float out_buf[8] = {};
  float scale_inv = 1.0f;
  fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {8}, q);
  in.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  in.scale_inv = &scale_inv;
  fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {8}, out_buf);
  auto expect = [&](int from_col, fp8kit_status status, const char* fragment) {
    EXPECT_EQ(fp8kit_dequantize(&in, &out, from_col, nullptr), status);
    const std::string msg = fp8kit_last_error();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find("dequantize"), std::string::npos) << msg;
  };
  ASSERT_EQ(fp8kit_dequantize(&in, &out, 0, nullptr), FP8KIT_OK) << fp8kit_last_error();
  expect(1, FP8KIT_INVALID_ARGUMENT, "columnwise_data is NULL");
  in.scale_inv = nullptr;
  expect(0, FP8KIT_INVALID_ARGUMENT, "scale_inv is NULL");
  in.scale_inv = &scale_inv;
  in.data = nullptr;
  expect(0, FP8KIT_INVALID_ARGUMENT, "from_columnwise = 1");
  in.data = q;
  out.dtype = FP8KIT_E5M2;
  expect(0, FP8KIT_INVALID_ARGUMENT, "output has dtype e5m2");
  out.dtype = FP8KIT_FLOAT32;
  in.dtype = FP8KIT_BFLOAT16;
  expect(0, FP8KIT_INVALID_ARGUMENT, "input has dtype bfloat16");
  in.dtype = FP8KIT_E4M3;
  out.shape[0] = 4;
  expect(0, FP8KIT_INVALID_ARGUMENT, "shape");
  out.shape[0] = 8;
  in.scaling_mode = fp8kit_scaling_mode(7);
  expect(0, FP8KIT_INVALID_ARGUMENT, "unknown scaling_mode 7");
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaQuantDequantize, MatchesCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int64_t>> shapes = {{}, {1}, {256}, {16, 16}, {3, 5, 7},
                                                    {1, 300}, {300, 1}, {100, 257}, {512, 1024}};
  uint32_t seed = 1;
  for (const auto& shape : shapes) {
    const size_t n = size_t(qtest::numel(shape));
    std::vector<uint8_t> q(n);
    std::mt19937 rng(seed++);
    for (auto& b : q) b = uint8_t(rng());
    for (fp8kit_dtype fmt : {FP8KIT_E4M3, FP8KIT_E5M2}) {
      for (fp8kit_dtype out : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        for (bool from_col : {false, true}) {
          DequantSpec s;
          s.fp8 = fmt;
          s.out_dtype = out;
          s.shape = shape;
          s.from_columnwise = from_col;
          s.scale_inv = 0.3f;
          const DequantResult c = run_dequantize(FP8KIT_DEVICE_CPU, s, q);
          const DequantResult g = run_dequantize(FP8KIT_DEVICE_CUDA, s, q);
          ASSERT_EQ(c.status, FP8KIT_OK) << c.error;
          ASSERT_EQ(g.status, FP8KIT_OK) << g.error;
          EXPECT_EQ(c.out, g.out) << fp8kit_dtype_name(fmt) << "->" << fp8kit_dtype_name(out)
                                  << " n=" << n << " from_columnwise=" << from_col;
        }
      }
    }
  }
}

#else

TEST(CudaQuantDequantize, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
