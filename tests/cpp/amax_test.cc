// fp8kit_amax: every bf16 / fp16 pattern, float32 specials, NaN
// propagation, empty and rank-0 tensors, errors; on a GPU, CUDA == CPU for
// sizes and alignments that exercise the vector body, head and tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

struct AmaxRun {
  fp8kit_status status;
  std::string error;
  float amax;
};

AmaxRun run_amax(fp8kit_device_type dev, fp8kit_dtype dtype, const std::vector<int64_t>& shape,
                 const std::vector<uint8_t>& bytes, size_t offset = 0) {
  qtest::Buffer in(dev, bytes.size(), offset), out(dev, 4);
  in.upload(bytes.data(), bytes.size());
  out.set_float(-5.0f);
  fp8kit_tensor t = qtest::make_tensor(dev, dtype, shape, in.ptr());
  AmaxRun r;
  r.status = fp8kit_amax(&t, out.fptr(), nullptr);
  r.error = fp8kit_last_error();
  r.amax = r.status == FP8KIT_OK ? out.get_float() : NAN;
  return r;
}

std::vector<uint8_t> patterns_without_nan(fp8kit_dtype dtype) {
  std::vector<uint8_t> b;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    const uint32_t mag = h & 0x7fffu;
    if (dtype == FP8KIT_BFLOAT16 ? mag > 0x7f80u : mag > 0x7c00u) continue;
    b.push_back(uint8_t(h & 0xff));
    b.push_back(uint8_t(h >> 8));
  }
  return b;
}

TEST(Amax, All16BitPatterns) {
  for (fp8kit_dtype dtype : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
    std::vector<uint8_t> b = patterns_without_nan(dtype);
    const int64_t n = int64_t(b.size() / 2);
    AmaxRun r = run_amax(FP8KIT_DEVICE_CPU, dtype, {n}, b);
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.amax, INFINITY) << "the patterns include +-inf";
    // Without the infinities: the largest finite value.
    std::vector<uint8_t> finite;
    for (size_t i = 0; i < b.size(); i += 2) {
      const uint16_t h = uint16_t(b[i] | (b[i + 1] << 8));
      if ((h & 0x7fffu) != (dtype == FP8KIT_BFLOAT16 ? 0x7f80u : 0x7c00u)) {
        finite.push_back(b[i]);
        finite.push_back(b[i + 1]);
      }
    }
    r = run_amax(FP8KIT_DEVICE_CPU, dtype, {int64_t(finite.size() / 2)}, finite);
    EXPECT_EQ(r.amax, dtype == FP8KIT_BFLOAT16 ? qtest::decode_bf16(0x7f7f) : 65504.0f);
    // One NaN anywhere gives NaN.
    const uint16_t nan = dtype == FP8KIT_BFLOAT16 ? 0xffc1 : 0xfe01;
    finite[1000] = uint8_t(nan & 0xff);
    finite[1001] = uint8_t(nan >> 8);
    r = run_amax(FP8KIT_DEVICE_CPU, dtype, {int64_t(finite.size() / 2)}, finite);
    EXPECT_TRUE(std::isnan(r.amax));
  }
}

TEST(Amax, Float32SpecialsEmptyAndRankZero) {
  std::vector<float> x = {-0.0f, 1e-45f, -3.5f, 2.0f};
  AmaxRun r = run_amax(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {4}, qtest::encode_input(x, FP8KIT_FLOAT32));
  EXPECT_EQ(r.amax, 3.5f);
  r = run_amax(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {}, qtest::encode_input({-9.0f}, FP8KIT_FLOAT32));
  EXPECT_EQ(r.amax, 9.0f);
  r = run_amax(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {0, 3}, {});
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  EXPECT_EQ(r.amax, 0.0f);
  x[2] = -NAN;
  r = run_amax(FP8KIT_DEVICE_CPU, FP8KIT_FLOAT32, {2, 2}, qtest::encode_input(x, FP8KIT_FLOAT32));
  EXPECT_TRUE(std::isnan(r.amax));
}

TEST(Amax, Errors) {
  uint8_t buf[8] = {};
  fp8kit_tensor t = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {8}, buf);
  float out = 0.0f;
  EXPECT_EQ(fp8kit_amax(&t, &out, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("e4m3"), std::string::npos);
  t.dtype = FP8KIT_BFLOAT16;
  EXPECT_EQ(fp8kit_amax(&t, nullptr, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("amax_out"), std::string::npos);
  EXPECT_EQ(fp8kit_amax(nullptr, &out, nullptr), FP8KIT_INVALID_ARGUMENT);
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaAmax, MatchesCpuForSizesAndAlignments) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 9;
  for (int64_t n : {1, 7, 8, 9, 31, 1000, 4097, 65536 + 3, 3000000}) {
    for (fp8kit_dtype dtype : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32}) {
      for (size_t offset_elems : {0, 1, 3}) {
        std::vector<float> x = qtest::random_values(size_t(n), 5.0f, seed++, false);
        // The max sits in the head, the body or the tail in turn.
        x[size_t((seed * 7919) % uint32_t(n))] = -1000.0f;
        const std::vector<uint8_t> b = qtest::encode_input(x, dtype);
        const size_t offset = offset_elems * fp8kit_dtype_size(dtype);
        const AmaxRun c = run_amax(FP8KIT_DEVICE_CPU, dtype, {n}, b);
        const AmaxRun g = run_amax(FP8KIT_DEVICE_CUDA, dtype, {n}, b, offset);
        ASSERT_EQ(g.status, FP8KIT_OK) << g.error;
        EXPECT_EQ(qtest::float_bits(c.amax), qtest::float_bits(g.amax))
            << fp8kit_dtype_name(dtype) << " n=" << n << " offset=" << offset;
      }
    }
  }
}

TEST(CudaAmax, NaNInfAndEmpty) {
  QTEST_SKIP_WITHOUT_GPU();
  for (fp8kit_dtype dtype : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32}) {
    std::vector<float> x = qtest::random_values(100003, 1.0f, 4, false);
    x[5] = INFINITY;
    AmaxRun g = run_amax(FP8KIT_DEVICE_CUDA, dtype, {100003}, qtest::encode_input(x, dtype));
    EXPECT_EQ(g.amax, INFINITY) << fp8kit_dtype_name(dtype);
    for (size_t pos : {size_t(0), size_t(50000), size_t(100002)}) {
      std::vector<float> y = x;
      y[pos] = NAN;
      g = run_amax(FP8KIT_DEVICE_CUDA, dtype, {100003}, qtest::encode_input(y, dtype));
      EXPECT_TRUE(std::isnan(g.amax)) << fp8kit_dtype_name(dtype) << " NaN at " << pos;
    }
    g = run_amax(FP8KIT_DEVICE_CUDA, dtype, {0}, {});
    ASSERT_EQ(g.status, FP8KIT_OK) << g.error;
    EXPECT_EQ(g.amax, 0.0f);
  }
}

#else

TEST(CudaAmax, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
