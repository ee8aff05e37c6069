// fp8kit_quantize (delayed scaling: the scale is given): bit-exactness
// against the independent reference of quant_test_util.h on every bf16 and
// fp16 pattern and on random float32 data, special values, layouts and
// shapes, errors; and on a GPU, CUDA == CPU byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"
#ifdef FP8KIT_WITH_CUDA
#include "fp8_cvt_selftest.h"
#endif

namespace {

using qtest::QuantResult;
using qtest::QuantSpec;

std::vector<uint8_t> all_16bit_patterns() {
  std::vector<uint8_t> bytes(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    std::memcpy(&bytes[2 * i], &h, 2);
  }
  return bytes;
}

const fp8kit_dtype kFormats[] = {FP8KIT_E4M3, FP8KIT_E5M2};

// Scales that move the 16-bit patterns through the whole FP8 range:
// saturation, the denormals and exact ties.
const std::vector<float> kScales = {1.0f,     0.25f,   3.0f, 1.0f / 448.0f,
                                    0x1p-20f, 1000.0f, 0.1f, 7.3e5f};

// Every bit pattern of a 16-bit input dtype at several scales.
struct PatternCase {
  const char* name;
  fp8kit_dtype in_dtype;
  std::vector<int64_t> shape;  // 65536 elements
  std::vector<float> scales;
};

std::ostream& operator<<(std::ostream& os, const PatternCase& c) { return os << c.name; }

const PatternCase kPatternCases[] = {
    {"Bf16", FP8KIT_BFLOAT16, {256, 256}, kScales},
    {"Fp16", FP8KIT_FLOAT16, {512, 128}, {1.0f, 0.01f, 64.0f, 0x1p-10f}},
};

class AllSixteenBitPatterns : public ::testing::TestWithParam<PatternCase> {};

TEST_P(AllSixteenBitPatterns, MatchReference) {
  const PatternCase& c = GetParam();
  const std::vector<uint8_t> input = all_16bit_patterns();
  for (fp8kit_dtype fmt : kFormats) {
    for (float scale : c.scales) {
      QuantSpec s;
      s.in_dtype = c.in_dtype;
      s.shape = c.shape;
      s.fp8 = fmt;
      s.scale = scale;
      const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
      ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
      SCOPED_TRACE(std::string(fp8kit_dtype_name(fmt)) + " scale " + std::to_string(scale));
      qtest::expect_matches_reference(s, input, r, scale);
      EXPECT_TRUE(std::isnan(r.amax)) << "the patterns include NaN";
      EXPECT_EQ(qtest::float_bits(r.scale_inv), qtest::float_bits(float(1.0 / double(scale))));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Quantize, AllSixteenBitPatterns, ::testing::ValuesIn(kPatternCases),
                         [](const ::testing::TestParamInfo<PatternCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(Quantize, RandomFloat32AtSeveralScalesMatchesReference) {
  uint32_t seed = 1;
  for (fp8kit_dtype fmt : kFormats) {
    for (float sigma : {1e-6f, 1e-2f, 1.0f, 300.0f, 1e5f}) {
      for (float scale : {1.0f, 0.37f, 1.0f / sigma}) {
        QuantSpec s;
        s.in_dtype = FP8KIT_FLOAT32;
        s.shape = {37, 3, 41};
        s.fp8 = fmt;
        s.scale = scale;
        const std::vector<uint8_t> input = qtest::encode_input(
            qtest::random_values(size_t(qtest::numel(s.shape)), sigma, seed++, true),
            FP8KIT_FLOAT32);
        const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
        ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
        SCOPED_TRACE(std::string(fp8kit_dtype_name(fmt)) + " sigma " + std::to_string(sigma));
        qtest::expect_matches_reference(s, input, r, scale);
        EXPECT_EQ(qtest::float_bits(r.amax),
                  qtest::float_bits(qtest::ref_amax(input, FP8KIT_FLOAT32, input.size() / 4)));
      }
    }
  }
}

// Hand-written expectations (they also check the test's own reference).
struct Special {
  float x;
  fp8kit_dtype fmt;
  uint8_t code;
};

TEST(Quantize, SpecialValues) {
  const Special cases[] = {
      {448.0f, FP8KIT_E4M3, 0x7e},      {449.0f, FP8KIT_E4M3, 0x7e},
      {464.0f, FP8KIT_E4M3, 0x7e},      {1e30f, FP8KIT_E4M3, 0x7e},
      {INFINITY, FP8KIT_E4M3, 0x7f},    {-INFINITY, FP8KIT_E4M3, 0x7f},  // no inf: NaN
      {NAN, FP8KIT_E4M3, 0x7f},         {-NAN, FP8KIT_E4M3, 0x7f},
      {0.0f, FP8KIT_E4M3, 0x00},        {-0.0f, FP8KIT_E4M3, 0x80},
      {0x1p-9f, FP8KIT_E4M3, 0x01},     {0x1p-10f, FP8KIT_E4M3, 0x00},  // tie -> even 0
      {0x3p-10f, FP8KIT_E4M3, 0x02},    {-0x3p-10f, FP8KIT_E4M3, 0x82},  // tie -> even 2
      {1e-40f, FP8KIT_E4M3, 0x00},      {-1e-40f, FP8KIT_E4M3, 0x80},
      {1.0625f, FP8KIT_E4M3, 0x38},     {1.1875f, FP8KIT_E4M3, 0x3a},   // ties
      {0x1.fp-7f, FP8KIT_E4M3, 0x08},   // rounds up into the smallest normal 2^-6
      {57344.0f, FP8KIT_E5M2, 0x7b},    {61440.0f, FP8KIT_E5M2, 0x7b},
      {INFINITY, FP8KIT_E5M2, 0x7c},    {-INFINITY, FP8KIT_E5M2, 0xfc},
      {NAN, FP8KIT_E5M2, 0x7f},         {-0.0f, FP8KIT_E5M2, 0x80},
      {0x1p-16f, FP8KIT_E5M2, 0x01},    {0x1p-17f, FP8KIT_E5M2, 0x00},
      {1.125f, FP8KIT_E5M2, 0x3c},      {1.375f, FP8KIT_E5M2, 0x3e},
      {-3.0f, FP8KIT_E5M2, 0xc2},
  };
  for (const Special& c : cases) {
    SCOPED_TRACE(std::string(fp8kit_dtype_name(c.fmt)) + " x=" + std::to_string(c.x));
    if (!std::isnan(c.x)) {
      EXPECT_EQ(qtest::ref_encode(c.x, c.fmt), c.code) << "test reference";
    }
    QuantSpec s;
    s.in_dtype = FP8KIT_FLOAT32;
    s.shape = {1};
    s.fp8 = c.fmt;
    const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input({c.x}, FP8KIT_FLOAT32));
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.data[0], c.code);
    EXPECT_EQ(r.columnwise[0], c.code);
  }
}

TEST(Quantize, AmaxAndScaleInv) {
  QuantSpec s;
  s.in_dtype = FP8KIT_FLOAT32;
  s.shape = {4, 5};
  s.scale = 3.0f;
  std::vector<float> x(20, 0.5f);
  x[7] = -123.25f;
  x[11] = 100.0f;
  QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, FP8KIT_FLOAT32));
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  EXPECT_EQ(r.amax, 123.25f);
  EXPECT_EQ(r.scale, 3.0f) << "delayed quantize must not touch the scale";
  EXPECT_EQ(qtest::float_bits(r.scale_inv), qtest::float_bits(float(1.0 / 3.0)));

  x[3] = -INFINITY;
  r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, FP8KIT_FLOAT32));
  EXPECT_EQ(r.amax, INFINITY);
  x[4] = NAN;
  r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, FP8KIT_FLOAT32));
  EXPECT_TRUE(std::isnan(r.amax));
}

TEST(Quantize, RowwiseAndColumnwiseAgreeForEveryLayoutChoice) {
  const std::vector<std::vector<int64_t>> shapes = {{},     {1},       {9},        {3, 5, 7},
                                                    {1, 1}, {1, 1000}, {1000, 1},  {129, 131},
                                                    {2, 3, 4, 5}};
  uint32_t seed = 10;
  for (const auto& shape : shapes) {
    QuantSpec s;
    s.shape = shape;
    s.scale = 2.0f;
    const std::vector<uint8_t> input = qtest::encode_input(
        qtest::random_values(size_t(qtest::numel(shape)), 50.0f, seed++, true), s.in_dtype);
    const QuantResult both = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
    ASSERT_EQ(both.status, FP8KIT_OK) << both.error;
    qtest::expect_matches_reference(s, input, both, s.scale);
    QuantSpec rowwise_only = s, columnwise_only = s;
    rowwise_only.columnwise = false;
    columnwise_only.rowwise = false;
    columnwise_only.with_amax = false;
    const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, rowwise_only, input);
    const QuantResult c = qtest::run_quantize(FP8KIT_DEVICE_CPU, columnwise_only, input);
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    ASSERT_EQ(c.status, FP8KIT_OK) << c.error;
    EXPECT_EQ(r.data, both.data);
    EXPECT_EQ(c.columnwise, both.columnwise);
    EXPECT_EQ(c.amax, -7.0f) << "amax is left alone when output->amax is NULL";
    EXPECT_TRUE(qtest::same_float(r.amax, both.amax));
  }
}

TEST(Quantize, EmptyTensorsWriteScalarsOnly) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{0}, {0, 5}, {5, 0}, {2, 0, 3}}) {
    fp8kit_tensor in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_BFLOAT16, shape, nullptr);
    fp8kit_tensor out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, nullptr);
    float scale = 4.0f, scale_inv = -1.0f, amax = -1.0f;
    out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    out.scale = &scale;
    out.scale_inv = &scale_inv;
    out.amax = &amax;
    ASSERT_EQ(fp8kit_quantize(&in, &out, nullptr), FP8KIT_OK) << fp8kit_last_error();
    EXPECT_EQ(amax, 0.0f);
    EXPECT_EQ(scale_inv, 0.25f);
  }
}

// ------------------------------------------------------------ errors --

class QuantizeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    in = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_BFLOAT16, {4, 8}, in_buf);
    out = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {4, 8}, out_buf);
    out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    out.columnwise_data = out_t_buf;
    out.scale = &scale;
    out.scale_inv = &scale_inv;
    out.amax = &amax;
  }
  // Runs fp8kit_quantize and expects `status` with a message containing
  // every fragment.
  void expect_error(fp8kit_status status, std::initializer_list<const char*> fragments) {
    const fp8kit_status got = fp8kit_quantize(&in, &out, nullptr);
    const std::string msg = fp8kit_last_error();
    EXPECT_EQ(got, status) << fp8kit_status_name(got) << ": " << msg;
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
  }
  uint16_t in_buf[32] = {};
  uint8_t out_buf[32] = {}, out_t_buf[32] = {};
  float scale = 1.0f, scale_inv = 0.0f, amax = 0.0f;
  fp8kit_tensor in{}, out{};
};

TEST_F(QuantizeErrors, ValidArgumentsPass) {
  EXPECT_EQ(fp8kit_quantize(&in, &out, nullptr), FP8KIT_OK) << fp8kit_last_error();
}

TEST_F(QuantizeErrors, NullDescriptors) {
  EXPECT_EQ(fp8kit_quantize(nullptr, &out, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("input"), std::string::npos);
  EXPECT_EQ(fp8kit_quantize(&in, nullptr, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("output"), std::string::npos);
}

TEST_F(QuantizeErrors, InputMustBeHighPrecision) {
  in.dtype = FP8KIT_E5M2;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"quantize", "input", "e5m2", "float32, bfloat16 or float16"});
}

TEST_F(QuantizeErrors, OutputMustBeFp8) {
  out.dtype = FP8KIT_BFLOAT16;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"output", "bfloat16", "e4m3 or e5m2"});
}

TEST_F(QuantizeErrors, ShapeMismatch) {
  out.shape[1] = 9;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"input has shape [4, 8]", "output has shape [4, 9]"});
}

TEST_F(QuantizeErrors, NeedsAnOutputBuffer) {
  out.data = nullptr;
  out.columnwise_data = nullptr;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"neither data nor columnwise_data"});
}

TEST_F(QuantizeErrors, NeedsScale) {
  out.scale = nullptr;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"output->scale is NULL"});
}

TEST_F(QuantizeErrors, ScalingModes) {
  out.scaling_mode = FP8KIT_SCALING_NONE;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"FP8KIT_SCALING_PER_TENSOR"});
  out.scaling_mode = fp8kit_scaling_mode(42);
  expect_error(FP8KIT_INVALID_ARGUMENT, {"unknown scaling_mode"});
}

TEST_F(QuantizeErrors, BadShapesAndPointers) {
  in.shape[0] = -4;
  out.shape[0] = -4;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"negative dimension"});
  SetUp();
  in.rank = 9;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"rank 9"});
  SetUp();
  in.data = nullptr;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"input", "data pointer is NULL"});
  SetUp();
  in.data = reinterpret_cast<uint8_t*>(in_buf) + 1;
  expect_error(FP8KIT_INVALID_ARGUMENT, {"input->data is not aligned", "2 bytes"});
}

TEST_F(QuantizeErrors, DeviceMismatchOrMissingCuda) {
  out.device_type = FP8KIT_DEVICE_CUDA;
  const fp8kit_status got = fp8kit_quantize(&in, &out, nullptr);
  EXPECT_NE(got, FP8KIT_OK);
  const std::string msg = fp8kit_last_error();
  if (!fp8kit_built_with_cuda()) {
    EXPECT_EQ(got, FP8KIT_UNSUPPORTED);
    EXPECT_NE(msg.find("no CUDA support"), std::string::npos) << msg;
  } else if (qtest::gpu_available()) {
    EXPECT_NE(msg.find("different devices"), std::string::npos) << msg;
  }
}

// -------------------------------------------------------------- CUDA --

#ifdef FP8KIT_WITH_CUDA

TEST(CudaQuantize, HardwareConversionMatchesSoftwareOnAllFloat32) {
  QTEST_SKIP_WITHOUT_GPU();
  for (bool e4m3 : {true, false}) {
    const fp8kit_test::CvtSelftestResult r = fp8kit_test::fp8_cvt_selftest(e4m3);
    ASSERT_EQ(r.error, cudaSuccess) << cudaGetErrorString(r.error);
    EXPECT_EQ(r.mismatches, 0u) << (e4m3 ? "e4m3" : "e5m2") << ": first mismatching float32 bits 0x"
                                << std::hex << r.first_mismatch
                                << " (rebuild with -DFP8KIT_FP8_SOFTWARE_CVT to use the software "
                                   "conversion in the kernels)";
  }
}

void expect_cuda_matches_cpu(const QuantSpec& s, const std::vector<uint8_t>& input,
                             const std::string& what) {
  const QuantResult cpu = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
  const QuantResult gpu = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
  qtest::expect_same_result(cpu, gpu, what);
}

std::string describe(const QuantSpec& s) {
  std::string d = std::string(fp8kit_dtype_name(s.in_dtype)) + "->" + fp8kit_dtype_name(s.fp8) + " [";
  for (size_t i = 0; i < s.shape.size(); ++i) d += (i ? "," : "") + std::to_string(s.shape[i]);
  d += "] rowwise=" + std::to_string(s.rowwise) + " columnwise=" + std::to_string(s.columnwise) +
       " amax=" + std::to_string(s.with_amax) + " offsets=" + std::to_string(s.in_offset) + "/" +
       std::to_string(s.out_offset) + (s.current ? " current" : " delayed");
  return d;
}

TEST(CudaQuantize, AllBf16AndFp16PatternsMatchCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<uint8_t> input = all_16bit_patterns();
  for (fp8kit_dtype in_dtype : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
    for (fp8kit_dtype fmt : kFormats) {
      for (float scale : kScales) {
        QuantSpec s;
        s.in_dtype = in_dtype;
        s.shape = {256, 256};
        s.fp8 = fmt;
        s.scale = scale;
        expect_cuda_matches_cpu(s, input, describe(s) + " scale " + std::to_string(scale));
      }
    }
  }
}

// Shapes that hit every path of the kernels: interior and border tiles,
// rows not a multiple of 16 (8-byte and 1-byte columnwise stores), cols not
// a multiple of 8 (scalar loads), single rows / columns (flat kernel), many
// blocks (amax atomics), misaligned pointers.
TEST(CudaQuantize, ShapesLayoutsAndAlignmentsMatchCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int64_t>> shapes = {
      {},         {1},        {7},        {1, 1000},   {1000, 1},  {3, 5, 7},  {128, 128},
      {256, 384}, {129, 131}, {1000, 1000}, {1024, 1040}, {257, 33}, {64, 24}, {4, 4096},
      {4096, 8},  {2, 1024, 768}, {40000}};
  uint32_t seed = 100;
  for (const auto& shape : shapes) {
    const size_t n = size_t(qtest::numel(shape));
    const std::vector<float> x = qtest::random_values(n, 30.0f, seed++, true);
    for (fp8kit_dtype in_dtype : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32}) {
      const std::vector<uint8_t> input = qtest::encode_input(x, in_dtype);
      for (fp8kit_dtype fmt : kFormats) {
        QuantSpec s;
        s.in_dtype = in_dtype;
        s.shape = shape;
        s.fp8 = fmt;
        s.scale = 1.5f;
        expect_cuda_matches_cpu(s, input, describe(s));
      }
      QuantSpec s;
      s.in_dtype = in_dtype;
      s.shape = shape;
      s.scale = 0.75f;
      s.rowwise = false;
      expect_cuda_matches_cpu(s, input, describe(s));
      s.rowwise = true;
      s.columnwise = false;
      expect_cuda_matches_cpu(s, input, describe(s));
      s.columnwise = true;
      s.with_amax = false;
      s.in_offset = fp8kit_dtype_size(in_dtype);  // misaligned input rows
      s.out_offset = 1;                           // misaligned outputs
      expect_cuda_matches_cpu(s, input, describe(s));
      s.with_amax = true;
      s.in_offset = 0;
      s.out_offset = 8;  // 8-byte but not 16-byte aligned outputs
      expect_cuda_matches_cpu(s, input, describe(s));
    }
  }
}

TEST(CudaQuantize, NaNAndInfPropagateToAmax) {
  QTEST_SKIP_WITHOUT_GPU();
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4096, 4096}, {3, 1001}, {50001}}) {
    const size_t n = size_t(qtest::numel(shape));
    std::vector<float> x = qtest::random_values(n, 1.0f, 7, false);
    x[n - 1] = -INFINITY;
    QuantSpec s;
    s.shape = shape;
    std::vector<uint8_t> input = qtest::encode_input(x, s.in_dtype);
    QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.amax, INFINITY);
    x[n / 2] = NAN;
    input = qtest::encode_input(x, s.in_dtype);
    expect_cuda_matches_cpu(s, input, describe(s) + " with NaN");
    r = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
    EXPECT_TRUE(std::isnan(r.amax));
  }
}

TEST(CudaQuantize, AmaxFoundInEveryBlock) {
  QTEST_SKIP_WITHOUT_GPU();
  // The maximum moves through the tensor; the many-block reduction must find
  // it wherever it is.
  const std::vector<int64_t> shape = {1536, 1280};
  const size_t n = size_t(qtest::numel(shape));
  std::vector<float> x = qtest::random_values(n, 1.0f, 3, false);
  for (size_t pos : {size_t(0), size_t(12345), n / 2 + 77, n - 1}) {
    std::vector<float> y = x;
    y[pos] = -300.0f;
    QuantSpec s;
    s.shape = shape;
    const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, qtest::encode_input(y, s.in_dtype));
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.amax, 300.0f) << "max at " << pos;
  }
}

TEST(CudaQuantize, EmptyTensorWritesScalars) {
  QTEST_SKIP_WITHOUT_GPU();
  QuantSpec s;
  s.shape = {0, 16};
  s.scale = 8.0f;
  const QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CUDA, s, {});
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  EXPECT_EQ(r.amax, 0.0f);
  EXPECT_EQ(r.scale_inv, 0.125f);
}

TEST(CudaQuantize, RunsOnTheGivenStream) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> shape = {512, 640};
  const size_t n = size_t(qtest::numel(shape));
  const std::vector<uint8_t> input =
      qtest::encode_input(qtest::random_values(n, 10.0f, 5, true), FP8KIT_BFLOAT16);
  qtest::Buffer in(FP8KIT_DEVICE_CUDA, input.size()), out(FP8KIT_DEVICE_CUDA, n),
      columnwise(FP8KIT_DEVICE_CUDA, n), scale(FP8KIT_DEVICE_CUDA, 4),
      scale_inv(FP8KIT_DEVICE_CUDA, 4), amax(FP8KIT_DEVICE_CUDA, 4);
  in.upload(input.data(), input.size());
  scale.set_float(2.0f);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  fp8kit_tensor ti = qtest::make_tensor(FP8KIT_DEVICE_CUDA, FP8KIT_BFLOAT16, shape, in.ptr());
  fp8kit_tensor to = qtest::make_tensor(FP8KIT_DEVICE_CUDA, FP8KIT_E4M3, shape, out.ptr());
  to.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  to.columnwise_data = columnwise.ptr();
  to.scale = scale.fptr();
  to.scale_inv = scale_inv.fptr();
  to.amax = amax.fptr();
  ASSERT_EQ(fp8kit_quantize(&ti, &to, stream), FP8KIT_OK) << fp8kit_last_error();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  QuantSpec s;
  s.shape = shape;
  s.scale = 2.0f;
  const QuantResult cpu = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
  EXPECT_EQ(out.download(n), cpu.data);
  EXPECT_EQ(columnwise.download(n), cpu.columnwise);
  EXPECT_EQ(amax.get_float(), cpu.amax);
}

#else

TEST(CudaQuantize, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
