// fp8kit_grouped_quantize and fp8kit_grouped_gemm (fp8kit/grouped.h):
// against the independent FP8 reference of quant_test_util.h group by
// group, against the single-tensor ops on each group's rows, the layout
// of the grouped columnwise copy (padding and tail zero), empty groups,
// errors; and on a GPU, CUDA against the CPU bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

using qtest::Buffer;
constexpr int kStride = FP8KIT_GROUP_SCALE_STRIDE;

struct GroupedInput {
  int64_t features;
  std::vector<int64_t> sizes;
  fp8kit_dtype dtype = FP8KIT_BFLOAT16;
  int64_t tokens() const { return std::accumulate(sizes.begin(), sizes.end(), int64_t(0)); }
  int64_t groups() const { return int64_t(sizes.size()); }
};

struct GroupedResult {
  std::vector<uint8_t> data, columnwise;
  std::vector<float> scale, scale_inv, amax;  // one per group
};

std::vector<float> per_group(const std::vector<uint8_t>& bytes, int64_t groups) {
  std::vector<float> out(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) std::memcpy(&out[g], &bytes[g * kStride * 4], 4);
  return out;
}

// Runs fp8kit_grouped_quantize on `dev` (scales given when `current` is NULL).
GroupedResult run_grouped_quantize(fp8kit_device_type dev, const GroupedInput& in,
                                   const std::vector<uint8_t>& input_bytes,
                                   const std::vector<float>& given_scales,
                                   const fp8kit_current_scaling_config* current,
                                   fp8kit_dtype fp8 = FP8KIT_E4M3,
                                   fp8kit_status expect = FP8KIT_OK,
                                   size_t input_offset = 0) {
  const int64_t t = in.tokens(), f = in.features, e = in.groups();
  const int64_t cap = fp8kit_grouped_columnwise_tokens(t, e);
  // The input `input_offset` bytes into its buffer (an element-aligned view
  // that is not 16-byte aligned takes the kernels' element-wise path).
  std::vector<uint8_t> placed(input_offset, 0);
  placed.insert(placed.end(), input_bytes.begin(), input_bytes.end());
  Buffer x(dev, placed.size()), data(dev, size_t(t * f)), cw(dev, size_t(f * cap));
  Buffer sizes(dev, size_t(e) * 8);
  Buffer scale(dev, size_t(e) * kStride * 4), scale_inv(dev, size_t(e) * kStride * 4),
      amax(dev, size_t(e) * kStride * 4);
  x.upload(placed.data(), placed.size());
  sizes.upload(in.sizes.data(), size_t(e) * 8);
  std::vector<float> scales(size_t(e * kStride), 0.0f);
  for (int64_t g = 0; g < e && !given_scales.empty(); ++g) scales[g * kStride] = given_scales[g];
  scale.upload(scales.data(), scales.size() * 4);
  const int64_t x_shape[2] = {t, f};
  const int64_t e_shape[1] = {e};
  fp8kit_tensor input = fp8kit_tensor_make(dev, 0, in.dtype, 2, x_shape,
                                           static_cast<uint8_t*>(x.ptr()) + input_offset);
  fp8kit_tensor out = fp8kit_tensor_make(dev, 0, fp8, 2, x_shape, data.ptr());
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  out.columnwise_data = cw.ptr();
  out.scale = scale.fptr();
  out.scale_inv = scale_inv.fptr();
  out.amax = amax.fptr();
  fp8kit_tensor gs = fp8kit_tensor_make(dev, 0, FP8KIT_INT64, 1, e_shape, sizes.ptr());
  EXPECT_EQ(fp8kit_grouped_quantize(&input, &gs, &out, current, nullptr), expect)
      << fp8kit_last_error();
  GroupedResult r;
  if (expect != FP8KIT_OK) return r;
  r.data = data.download(size_t(t * f));
  r.columnwise = cw.download(size_t(f * cap));
  r.scale = per_group(scale.download(size_t(e * kStride * 4)), e);
  r.scale_inv = per_group(scale_inv.download(size_t(e * kStride * 4)), e);
  r.amax = per_group(amax.download(size_t(e * kStride * 4)), e);
  return r;
}

// Checks `r` group by group against the reference rounding with the
// group's own scale, and the columnwise layout: block g is [F, p_g] at
// F * (p_0 + ... + p_{g-1}), zero-padded, and the tail is zero.
void expect_grouped_reference(const GroupedInput& in, const std::vector<uint8_t>& input_bytes,
                              const GroupedResult& r, const std::vector<float>& scales) {
  const int64_t f = in.features;
  int64_t start = 0, column = 0;
  for (int64_t g = 0; g < in.groups(); ++g) {
    const int64_t m = in.sizes[g], padded = (m + 15) / 16 * 16;
    float amax = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < f; ++c) {
        const size_t idx = size_t((start + i) * f + c);
        const float v = qtest::input_value(input_bytes, in.dtype, idx);
        amax = std::max(amax, std::fabs(v));
        const uint8_t q = qtest::ref_quantize(v, scales[g], FP8KIT_E4M3);
        ASSERT_EQ(r.data[idx], q) << "group " << g << " row " << i << " col " << c;
        ASSERT_EQ(r.columnwise[size_t(f * column + c * padded + i)], q)
            << "columnwise of group " << g << " row " << i << " col " << c;
      }
    }
    for (int64_t c = 0; c < f; ++c) {
      for (int64_t i = m; i < padded; ++i) {
        ASSERT_EQ(r.columnwise[size_t(f * column + c * padded + i)], 0) << "pad of group " << g;
      }
    }
    EXPECT_EQ(r.amax[g], amax) << "group " << g;
    EXPECT_EQ(r.scale_inv[g], 1.0f / scales[g]) << "group " << g;
    start += m;
    column += padded;
  }
  for (size_t i = size_t(f * column); i < r.columnwise.size(); ++i) {
    ASSERT_EQ(r.columnwise[i], 0) << "tail byte " << i;
  }
}

std::vector<uint8_t> random_input(const GroupedInput& in, uint32_t seed) {
  const auto x = qtest::random_values(size_t(in.tokens() * in.features), 3.0f, seed, false);
  return qtest::encode_input(x, in.dtype);
}

const GroupedInput kUneven{32, {5, 0, 37, 16, 1, 0}};

TEST(GroupedQuantize, GivenScalesMatchTheReferencePerGroup) {
  const auto bytes = random_input(kUneven, 1);
  const std::vector<float> scales = {1.0f, 2.0f, 0.5f, 64.0f, 3.0f, 7.0f};
  const GroupedResult r =
      run_grouped_quantize(FP8KIT_DEVICE_CPU, kUneven, bytes, scales, nullptr);
  expect_grouped_reference(kUneven, bytes, r, scales);
  EXPECT_EQ(r.scale, scales);
}

TEST(GroupedQuantize, CurrentScalingTakesEachGroupsOwnAmax) {
  const auto bytes = random_input(kUneven, 2);
  const fp8kit_current_scaling_config current{0.0f, 0};
  const GroupedResult r = run_grouped_quantize(FP8KIT_DEVICE_CPU, kUneven, bytes, {}, &current);
  std::vector<float> expected(kUneven.sizes.size());
  for (size_t g = 0; g < expected.size(); ++g) {
    expected[g] = r.amax[g] > 0 ? 448.0f / r.amax[g] : 1.0f;
  }
  EXPECT_EQ(r.scale, expected);
  EXPECT_EQ(r.scale[1], 1.0f) << "an empty group has amax 0 and scale 1";
  expect_grouped_reference(kUneven, bytes, r, expected);
}

TEST(GroupedQuantize, EqualsTheSingleTensorQuantizeOfEachGroup) {
  const GroupedInput in{48, {7, 33, 0, 24}, FP8KIT_FLOAT32};
  const auto bytes = random_input(in, 3);
  const fp8kit_current_scaling_config current{0.0f, 1};
  const GroupedResult r = run_grouped_quantize(FP8KIT_DEVICE_CPU, in, bytes, {}, &current);
  int64_t start = 0;
  for (int64_t g = 0; g < in.groups(); ++g) {
    qtest::QuantSpec spec;
    spec.shape = {in.sizes[g], in.features};
    spec.in_dtype = in.dtype;
    spec.current = true;
    spec.config = current;
    const std::vector<uint8_t> rows(bytes.begin() + start * in.features * 4,
                                    bytes.begin() + (start + in.sizes[g]) * in.features * 4);
    const qtest::QuantResult single = qtest::run_quantize(FP8KIT_DEVICE_CPU, spec, rows);
    EXPECT_EQ(r.scale[g], single.scale) << "group " << g;
    const std::vector<uint8_t> grouped(r.data.begin() + start * in.features,
                                       r.data.begin() + (start + in.sizes[g]) * in.features);
    EXPECT_EQ(grouped, single.data) << "group " << g;
    start += in.sizes[g];
  }
}

TEST(GroupedQuantize, BadScaleGivesNanCodesForThatGroupOnly) {
  const GroupedInput in{16, {3, 4}};
  const auto bytes = random_input(in, 4);
  const GroupedResult r =
      run_grouped_quantize(FP8KIT_DEVICE_CPU, in, bytes, {0.0f, 1.0f}, nullptr);
  for (int64_t i = 0; i < 3 * 16; ++i) ASSERT_EQ(r.data[size_t(i)], 0x7F);
  EXPECT_TRUE(std::isnan(r.scale_inv[0]));
  EXPECT_EQ(r.scale_inv[1], 1.0f);
  EXPECT_NE(r.data[size_t(3 * 16)], 0x7F);
}

TEST(GroupedQuantize, RejectsSizesThatDoNotSumToTheRows) {
  const GroupedInput in{16, {3, 4}};
  const auto bytes = random_input(in, 5);
  const int64_t x_shape[2] = {7, 16};
  const int64_t e_shape[1] = {2};
  std::vector<uint8_t> out(7 * 16), cw(16 * 64);
  std::vector<float> scale(8, 1.0f), scale_inv(8), amax(8);
  fp8kit_tensor input = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_BFLOAT16, 2, x_shape,
                                           const_cast<uint8_t*>(bytes.data()));
  fp8kit_tensor q = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, x_shape, out.data());
  q.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  q.scale = scale.data();
  q.scale_inv = scale_inv.data();
  for (std::vector<int64_t> sizes : {std::vector<int64_t>{3, 5}, std::vector<int64_t>{-1, 8}}) {
    fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                          sizes.data());
    EXPECT_EQ(fp8kit_grouped_quantize(&input, &gs, &q, nullptr, nullptr),
              FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find("group_sizes"), std::string::npos)
        << fp8kit_last_error();
  }
  std::vector<int64_t> sizes = {3, 4};
  fp8kit_tensor as_float = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 1, e_shape,
                                              sizes.data());
  EXPECT_EQ(fp8kit_grouped_quantize(&input, &as_float, &q, nullptr, nullptr),
            FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("int64"), std::string::npos);
}

// fp8kit_grouped_check_sizes: the token-grouped ops' rule against a token
// count given apart from any tensor (what the padded block-scaled ops need).
TEST(GroupedCheckSizes, AcceptsSizesThatSumToTheTokensAndNamesAnyOther) {
  const int64_t e_shape[1] = {3};
  auto check = [&](std::vector<int64_t> sizes, int64_t tokens) {
    const fp8kit_tensor gs =
        fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape, sizes.data());
    return fp8kit_grouped_check_sizes(&gs, tokens, nullptr);
  };
  EXPECT_EQ(check({3, 0, 4}, 7), FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(check({0, 0, 0}, 0), FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(check({3, 0, 3}, 7), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("sum to 6 but the input has 7 rows"),
            std::string::npos)
      << fp8kit_last_error();
  EXPECT_EQ(check({3, 5, 0}, 7), FP8KIT_INVALID_ARGUMENT);
  EXPECT_EQ(check({3, -1, 5}, 7), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("group_sizes[1] is -1"), std::string::npos)
      << fp8kit_last_error();
  EXPECT_EQ(check({3, 0, 4}, -1), FP8KIT_INVALID_ARGUMENT);
  EXPECT_EQ(fp8kit_grouped_check_sizes(nullptr, 7, nullptr), FP8KIT_INVALID_ARGUMENT);
}

// ------------------------------------------------------------- GEMMs --

// A token-grouped FP8 operand and an expert-stacked one, made by the CPU
// grouped quantize, and the products of the single-tensor GEMM per group.
struct GemmCase {
  std::vector<int64_t> sizes;
  int64_t k, n;
};

float dequant(uint8_t q, float scale_inv) {
  return float(testref::decode_fp8(q, FP8KIT_E4M3)) * scale_inv;
}

// y = x @ w^T per group, x [T, K] grouped, w [E, N, K]; compared with a
// float64 product of the dequantized operands (the CPU GEMM accumulates in
// float32 with split accumulation, so within a relative 1e-5).
TEST(GroupedGemm, TokensGemmIsEachGroupsProduct) {
  const GemmCase c{{5, 0, 21, 16}, 32, 48};
  const int64_t t = 42, e = 4;
  const GroupedInput xin{c.k, c.sizes, FP8KIT_FLOAT32};
  const auto xb = random_input(xin, 7);
  const fp8kit_current_scaling_config current{0.0f, 0};
  const GroupedResult x = run_grouped_quantize(FP8KIT_DEVICE_CPU, xin, xb, {}, &current);
  const GroupedInput win{c.k, std::vector<int64_t>(size_t(e), c.n), FP8KIT_FLOAT32};
  const auto wb = random_input(win, 8);
  const GroupedResult w = run_grouped_quantize(FP8KIT_DEVICE_CPU, win, wb, {}, &current);
  std::vector<float> x_sinv(size_t(e * kStride)), w_sinv(size_t(e * kStride));
  for (int64_t g = 0; g < e; ++g) {
    x_sinv[g * kStride] = x.scale_inv[g];
    w_sinv[g * kStride] = w.scale_inv[g];
  }
  std::vector<float> y(size_t(t * c.n), -1.0f);
  const int64_t a_shape[2] = {t, c.k}, b_shape[3] = {e, c.n, c.k}, d_shape[2] = {t, c.n},
                e_shape[1] = {e};
  fp8kit_tensor a = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, a_shape,
                                       const_cast<uint8_t*>(x.data.data()));
  a.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  a.scale_inv = x_sinv.data();
  fp8kit_tensor b = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 3, b_shape,
                                       const_cast<uint8_t*>(w.data.data()));
  b.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  b.scale_inv = w_sinv.data();
  fp8kit_tensor d = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, d_shape, y.data());
  std::vector<int64_t> sizes = c.sizes;
  fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                        sizes.data());
  fp8kit_grouped_gemm_config config{1, nullptr, FP8KIT_BFLOAT16, 1};
  ASSERT_EQ(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_TOKENS, &a, &b, &d, &gs, &config, nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  int64_t start = 0;
  for (int64_t g = 0; g < e; ++g) {
    for (int64_t i = 0; i < c.sizes[g]; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double ref = 0.0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          ref += double(dequant(x.data[size_t((start + i) * c.k + kk)], 1.0f)) *
                 double(dequant(w.data[size_t((g * c.n + j) * c.k + kk)], 1.0f));
        }
        ref *= double(x.scale_inv[g]) * double(w.scale_inv[g]);
        ASSERT_NEAR(y[size_t((start + i) * c.n + j)], ref, 1e-5 * (1.0 + std::fabs(ref)))
            << "group " << g << " row " << i << " col " << j;
      }
    }
    start += c.sizes[g];
  }
}

// dw_g = dy_g^T @ x_g from the grouped columnwise copies; an empty group
// gets zeros (its D block is overwritten, whatever it held).
TEST(GroupedGemm, ContractGemmSumsEachGroupsTokens) {
  const std::vector<int64_t> sizes = {9, 0, 40};
  const int64_t e = 3, t = 49, m = 16, n = 32;
  const fp8kit_current_scaling_config current{0.0f, 0};
  const GroupedInput dyin{m, sizes, FP8KIT_FLOAT32}, xin{n, sizes, FP8KIT_FLOAT32};
  const auto dyb = random_input(dyin, 9), xb = random_input(xin, 10);
  const GroupedResult dy = run_grouped_quantize(FP8KIT_DEVICE_CPU, dyin, dyb, {}, &current);
  const GroupedResult x = run_grouped_quantize(FP8KIT_DEVICE_CPU, xin, xb, {}, &current);
  std::vector<float> dy_sinv(size_t(e * kStride)), x_sinv(size_t(e * kStride));
  for (int64_t g = 0; g < e; ++g) {
    dy_sinv[g * kStride] = dy.scale_inv[g];
    x_sinv[g * kStride] = x.scale_inv[g];
  }
  std::vector<float> dw(size_t(e * m * n), 123.0f);
  const int64_t a_shape[2] = {t, m}, b_shape[2] = {t, n}, d_shape[3] = {e, m, n},
                e_shape[1] = {e};
  fp8kit_tensor a = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, a_shape, nullptr);
  a.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  a.columnwise_data = const_cast<uint8_t*>(dy.columnwise.data());
  a.scale_inv = dy_sinv.data();
  fp8kit_tensor b = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, b_shape, nullptr);
  b.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  b.columnwise_data = const_cast<uint8_t*>(x.columnwise.data());
  b.scale_inv = x_sinv.data();
  fp8kit_tensor d = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 3, d_shape,
                                       dw.data());
  std::vector<int64_t> gsizes = sizes;
  fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                        gsizes.data());
  fp8kit_grouped_gemm_config config{0, nullptr, FP8KIT_BFLOAT16, 1};
  ASSERT_EQ(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, &a, &b, &d, &gs, &config,
                                nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  int64_t start = 0;
  for (int64_t g = 0; g < e; ++g) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0.0;
        for (int64_t r = 0; r < sizes[g]; ++r) {
          ref += double(dequant(dy.data[size_t((start + r) * m + i)], 1.0f)) *
                 double(dequant(x.data[size_t((start + r) * n + j)], 1.0f));
        }
        ref *= double(dy.scale_inv[g]) * double(x.scale_inv[g]);
        ASSERT_NEAR(dw[size_t((g * m + i) * n + j)], ref, 1e-5 * (1.0 + std::fabs(ref)))
            << "group " << g << " (" << i << ", " << j << ")";
      }
    }
    start += sizes[g];
  }
}

// ------------------------------------------------------- CUDA == CPU --

TEST(GroupedQuantizeGpu, MatchesTheCpuBitForBit) {
  QTEST_SKIP_WITHOUT_GPU();
  const fp8kit_current_scaling_config current{0.0f, 0};
  struct Case {
    GroupedInput in;
    size_t input_offset;  // bytes: 0 takes the 16-byte loads, 2 or 4 the element-wise path
  };
  for (const Case& c : {Case{kUneven, 0}, Case{GroupedInput{4096, {1000, 0, 3000, 96, 1}}, 0},
                        Case{GroupedInput{80, {0, 0, 130, 0}, FP8KIT_FLOAT16}, 0},
                        Case{GroupedInput{48, {3, 65, 0, 9}, FP8KIT_FLOAT32}, 0},
                        Case{GroupedInput{48, {3, 65, 0, 9}, FP8KIT_FLOAT32}, 4},
                        Case{GroupedInput{208, {70, 1, 0, 130}}, 2}}) {
    const GroupedInput& in = c.in;
    const auto bytes = random_input(in, 11);
    for (const fp8kit_current_scaling_config* cfg :
         {static_cast<const fp8kit_current_scaling_config*>(nullptr), &current}) {
      SCOPED_TRACE("features " + std::to_string(in.features) + " offset " +
                   std::to_string(c.input_offset) + (cfg ? " current" : " given scales"));
      std::vector<float> scales(in.sizes.size(), 3.0f);
      if (cfg != nullptr) scales.clear();
      const GroupedResult cpu = run_grouped_quantize(FP8KIT_DEVICE_CPU, in, bytes, scales, cfg);
      const GroupedResult gpu = run_grouped_quantize(FP8KIT_DEVICE_CUDA, in, bytes, scales, cfg,
                                                     FP8KIT_E4M3, FP8KIT_OK, c.input_offset);
      EXPECT_EQ(gpu.data, cpu.data);
      EXPECT_EQ(gpu.columnwise, cpu.columnwise);
      EXPECT_EQ(gpu.scale, cpu.scale);
      EXPECT_EQ(gpu.scale_inv, cpu.scale_inv);
      EXPECT_EQ(gpu.amax, cpu.amax);
    }
  }
}

// Runs one grouped GEMM on `dev` from host bytes (group sizes on `dev`
// too, so the CUDA path reads them back) and returns D as floats.
std::vector<float> run_grouped_gemm(fp8kit_device_type dev, fp8kit_grouped_gemm_kind kind,
                                    const std::vector<int64_t>& a_shape,
                                    const std::vector<uint8_t>& a_bytes, bool a_columnwise,
                                    const std::vector<int64_t>& b_shape,
                                    const std::vector<uint8_t>& b_bytes, bool b_columnwise,
                                    const std::vector<float>& a_sinv,
                                    const std::vector<float>& b_sinv,
                                    const std::vector<int64_t>& d_shape,
                                    std::vector<int64_t> sizes, int trans_b) {
  Buffer a(dev, a_bytes.size()), b(dev, b_bytes.size()), gs(dev, sizes.size() * 8);
  Buffer sa(dev, a_sinv.size() * 4), sb(dev, b_sinv.size() * 4);
  const size_t d_numel = size_t(qtest::numel(d_shape));
  Buffer d(dev, d_numel * 4);
  a.upload(a_bytes.data(), a_bytes.size());
  b.upload(b_bytes.data(), b_bytes.size());
  gs.upload(sizes.data(), sizes.size() * 8);
  sa.upload(a_sinv.data(), a_sinv.size() * 4);
  sb.upload(b_sinv.data(), b_sinv.size() * 4);
  fp8kit_tensor at = qtest::make_tensor(dev, FP8KIT_E4M3, a_shape, a_columnwise ? nullptr : a.ptr());
  at.columnwise_data = a_columnwise ? a.ptr() : nullptr;
  at.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  at.scale_inv = sa.fptr();
  fp8kit_tensor bt = qtest::make_tensor(dev, FP8KIT_E4M3, b_shape, b_columnwise ? nullptr : b.ptr());
  bt.columnwise_data = b_columnwise ? b.ptr() : nullptr;
  bt.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  bt.scale_inv = sb.fptr();
  fp8kit_tensor dt = qtest::make_tensor(dev, FP8KIT_FLOAT32, d_shape, d.ptr());
  const std::vector<int64_t> e_shape = {int64_t(sizes.size())};
  fp8kit_tensor gst = qtest::make_tensor(dev, FP8KIT_INT64, e_shape, gs.ptr());
  const fp8kit_grouped_gemm_config config{trans_b, nullptr, FP8KIT_BFLOAT16, 1};
  EXPECT_EQ(fp8kit_grouped_gemm(kind, &at, &bt, &dt, &gst, &config, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  const std::vector<uint8_t> bytes = d.download(d_numel * 4);
  std::vector<float> out(d_numel);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// The FP8 bytes with their sign bits cleared: the same GEMM over them gives
// each output's sum |a| |b|, the scale of its accumulation error.
std::vector<uint8_t> magnitudes(std::vector<uint8_t> bytes) {
  for (uint8_t& b : bytes) b &= 0x7f;
  return bytes;
}

// Hopper's FP8 tensor cores accumulate in fewer bits than float32 between
// promotions (gemm_test.cc measures up to 2^-14 sum |a| |b| with the split
// accumulator); 2^-11 leaves the same 8x margin. A layout, scale or group
// bug is off by the order of the outputs themselves.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                  const std::vector<float>& magnitude, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_EQ(magnitude.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_NEAR(gpu[i], cpu[i], std::ldexp(double(magnitude[i]), -11) + 1e-6 * std::fabs(cpu[i]))
        << what << " element " << i;
  }
}

TEST(GroupedGemmGpu, MatchesTheCpuWithSizesOnTheDevice) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = {100, 0, 333, 64, 7};
  const int64_t e = 5, t = 504, k = 256, n = 128;
  const fp8kit_current_scaling_config current{0.0f, 0};
  const GroupedInput xin{k, sizes}, dyin{n, sizes};
  const GroupedInput win{k, std::vector<int64_t>(size_t(e), n)};
  const GroupedResult x = run_grouped_quantize(FP8KIT_DEVICE_CPU, xin, random_input(xin, 12), {},
                                               &current);
  const GroupedResult dy = run_grouped_quantize(FP8KIT_DEVICE_CPU, dyin, random_input(dyin, 13),
                                                {}, &current);
  const GroupedResult w = run_grouped_quantize(FP8KIT_DEVICE_CPU, win, random_input(win, 14), {},
                                               &current);
  auto strided = [&](const std::vector<float>& v) {
    std::vector<float> out(size_t(e * kStride));
    for (int64_t g = 0; g < e; ++g) out[g * kStride] = v[g];
    return out;
  };
  // Each GEMM on the GPU, on the CPU, and on the CPU over the operands'
  // magnitudes (the bound of expect_close).
  auto check = [&](const char* what, auto&& run) {
    expect_close(run(FP8KIT_DEVICE_CUDA, false), run(FP8KIT_DEVICE_CPU, false),
                 run(FP8KIT_DEVICE_CPU, true), what);
  };
  auto bytes = [](const std::vector<uint8_t>& v, bool abs) { return abs ? magnitudes(v) : v; };
  check("forward", [&](fp8kit_device_type dev, bool abs) {
    return run_grouped_gemm(dev, FP8KIT_GROUPED_GEMM_TOKENS, {t, k}, bytes(x.data, abs), false,
                            {e, n, k}, bytes(w.data, abs), false, strided(x.scale_inv),
                            strided(w.scale_inv), {t, n}, sizes, 1);
  });
  // dgrad dx = dy @ w: w [E, N, K] read K-contiguous, i.e. from its
  // per-matrix columnwise copy [E, K, N] (the grouped copy of w's rows).
  check("dgrad", [&](fp8kit_device_type dev, bool abs) {
    return run_grouped_gemm(dev, FP8KIT_GROUPED_GEMM_TOKENS, {t, n}, bytes(dy.data, abs), false,
                            {e, n, k}, bytes(w.columnwise, abs), true, strided(dy.scale_inv),
                            strided(w.scale_inv), {t, k}, sizes, 0);
  });
  check("wgrad", [&](fp8kit_device_type dev, bool abs) {
    return run_grouped_gemm(dev, FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, {t, n},
                            bytes(dy.columnwise, abs), true, {t, k}, bytes(x.columnwise, abs),
                            true, strided(dy.scale_inv), strided(x.scale_inv), {e, n, k}, sizes,
                            0);
  });
}

}  // namespace
