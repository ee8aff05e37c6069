// Block scaling on a GPU: fp8kit_quantize_block_scaling and block-scaled
// fp8kit_dequantize on CUDA == CPU bit for bit (bytes, scales and their
// padding), and the cuBLASLt block-scaled GEMM against the float64
// reference and the CPU GEMM for every layout, or, on a device without it,
// the clear refusal; block-scaled GEMMs' plans in the one plan cache.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block_gemm_util.h"
#include "block_test_util.h"
#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"
#ifdef FP8KIT_WITH_CUDA
#include "gemm_plan_cache.h"
#endif

namespace {

using blockgemm::Case;
using blocktest::Spec;

const fp8kit_scaling_mode kModes[] = {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128};

void expect_gpu_equals_cpu(const Spec& s, const std::vector<uint8_t>& input) {
  const std::string what = blocktest::spec_name(s);
  const blocktest::Result cpu = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, input);
  const blocktest::Result gpu = blocktest::run_quantize(FP8KIT_DEVICE_CUDA, s, input);
  ASSERT_EQ(cpu.status, FP8KIT_OK) << what << ": " << cpu.error;
  ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
  if (s.rowwise) blocktest::expect_same_copy(gpu.rowwise, cpu.rowwise, what + " rowwise");
  if (s.columnwise) {
    blocktest::expect_same_copy(gpu.columnwise, cpu.columnwise, what + " columnwise");
  }
}

TEST(BlockScalingGpu, QuantizeEqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  // Edge tiles in both directions, unaligned row lengths (byte stores), one
  // row, one column, rank 3, several tiles, and rows that end inside a
  // thread's 8 rows and its 16-byte loads (261 = 256 + 5).
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1},      {3, 5, 130}, {300, 260}, {128, 128}, {129, 1},
      {1, 257},    {512, 1024}, {0, 64},    {264, 136}, {261, 264}};
  uint32_t seed = 40;
  for (const auto& shape : shapes) {
    for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (fp8kit_scaling_mode mode : kModes) {
        for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
          for (int copies = 0; copies < 3; ++copies) {
            Spec s;
            s.in_dtype = in;
            s.shape = shape;
            s.mode = mode;
            s.fp8 = fp8;
            s.rowwise = copies != 1;
            s.columnwise = copies != 2;
            s.config.power_2_scale = int(seed % 2);
            s.config.amax_epsilon = seed % 3 == 0 ? 1e-2f : 0.0f;
            const size_t n = size_t(qtest::numel(shape));
            const std::vector<uint8_t> input = qtest::encode_input(
                qtest::random_values(n, seed % 5 == 0 ? 1e-30f : 3.0f, seed, true, seed % 4 == 0),
                in);
            ++seed;
            expect_gpu_equals_cpu(s, input);
          }
        }
      }
    }
  }
}

// A NaN or an inf sets the scale of its own lines (1x128) or block
// (128x128) and of no other: single non-finite values in edge tiles, in a
// thread's second batch of rows, and near tile borders; with and without
// 16-byte loads and 8-byte stores.
TEST(BlockScalingGpu, NonFiniteInOneLineEqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> shape = {300, 264};
  const int64_t cols = shape[1];
  const struct {
    int64_t r, c;
    float x;
  } specials[] = {{290, 131, NAN}, {5, 259, INFINITY}, {130, 7, -INFINITY}, {127, 128, NAN}};
  uint32_t seed = 70;
  for (fp8kit_dtype in : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
    for (fp8kit_scaling_mode mode : kModes) {
      for (bool misaligned : {false, true}) {
        std::vector<float> x =
            qtest::random_values(size_t(qtest::numel(shape)), 3.0f, seed++, false);
        for (const auto& sp : specials) x[size_t(sp.r * cols + sp.c)] = sp.x;
        Spec s;
        s.in_dtype = in;
        s.shape = shape;
        s.mode = mode;
        s.misaligned = misaligned;
        expect_gpu_equals_cpu(s, qtest::encode_input(x, in));
      }
    }
  }
}

TEST(BlockScalingGpu, AllBf16PatternsEqualCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  const std::vector<uint8_t> input = blocktest::all_bf16_patterns();
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{512, 128}, {128, 512}}) {
    for (fp8kit_scaling_mode mode : kModes) {
      for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
        Spec s;
        s.shape = shape;
        s.mode = mode;
        s.fp8 = fp8;
        s.config.power_2_scale = 1;
        expect_gpu_equals_cpu(s, input);
      }
    }
  }
}

TEST(BlockScalingGpu, DequantizeEqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  for (fp8kit_scaling_mode mode : kModes) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{300, 260}, {1, 200}, {200, 1}}) {
      const auto [rows, cols] = qtest::flat2d(shape);
      const blockgemm::Operand op =
          blockgemm::make_operand(rows, cols, mode, FP8KIT_E4M3, uint32_t(rows + cols));
      for (fp8kit_dtype out_dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        for (int from_columnwise : {0, 1}) {
          std::vector<uint8_t> results[2];
          for (fp8kit_device_type dev : {FP8KIT_DEVICE_CPU, FP8KIT_DEVICE_CUDA}) {
            blockgemm::DeviceOperand in(dev, op);
            const size_t bytes = size_t(rows * cols) * fp8kit_dtype_size(out_dtype);
            qtest::Buffer out(dev, bytes);
            fp8kit_tensor to = qtest::make_tensor(dev, out_dtype, shape, out.ptr());
            ASSERT_EQ(fp8kit_dequantize(&in.t, &to, from_columnwise, nullptr), FP8KIT_OK)
                << fp8kit_last_error();
            results[dev == FP8KIT_DEVICE_CUDA] = out.download(bytes);
          }
          EXPECT_EQ(results[0], results[1])
              << "mode " << int(mode) << " from_columnwise " << from_columnwise << " out "
              << fp8kit_dtype_name(out_dtype);
        }
      }
    }
  }
}

// On Hopper with cuBLASLt 12.9+: every layout within FP8 GEMM tolerance of
// the float64 reference and of the CPU GEMM. Elsewhere: the refusal.
TEST(BlockScalingGpu, GemmEveryLayout) {
  QTEST_SKIP_WITHOUT_GPU();
  int supported = 0;
  ASSERT_EQ(fp8kit_supports_block_scaled_fp8_gemm(FP8KIT_DEVICE_CUDA, 0, &supported), FP8KIT_OK)
      << fp8kit_last_error();
  uint32_t seed = 90;
  // {tokens, in, out}; the last makes K 16 or 32, below one 128 block.
  for (auto shape : {std::vector<int64_t>{272, 320, 144}, {512, 384, 256}, {16, 16, 32}}) {
    for (Case c : blockgemm::layer_cases(shape[0], shape[1], shape[2], seed)) {
      for (fp8kit_dtype d : {FP8KIT_BFLOAT16, FP8KIT_FLOAT32}) {
        for (int variant = 0; variant < 3; ++variant) {
          c.d_dtype = d;
          c.bias = variant == 1;
          c.beta = variant == 2 ? 1.0f : 0.0f;
          c.alpha = variant == 2 ? 0.5f : 1.0f;
          const std::string what = blockgemm::case_name(c);
          const blockgemm::Run gpu = blockgemm::run(FP8KIT_DEVICE_CUDA, c);
          if (!supported) {
            EXPECT_EQ(gpu.status, FP8KIT_UNSUPPORTED) << what;
            EXPECT_NE(gpu.error.find("cuBLASLt runs block-scaled FP8 GEMMs on Hopper"),
                      std::string::npos)
                << gpu.error;
            continue;
          }
          ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
          std::vector<double> sum_abs;
          const std::vector<double> want = blockgemm::reference(c, &sum_abs);
          // Hopper's FP8 tensor cores keep about 14 bits of a block's
          // running sum before cuBLASLt scales it into float32 (an H200 was
          // off by up to 1.5 * 2^-10 of sum |a b|): a 128-deep block may be
          // off by 128 * 2^-14 = 2^-7 of its sum |a b|, on top of D's own
          // rounding. A wrong scale or layout is off by O(1).
          const double rel = d == FP8KIT_FLOAT32 ? 0x1p-23 : 0x1p-8;
          constexpr double kAccumulation = 0x1p-7;
          blockgemm::expect_close(gpu.d, want, sum_abs, rel, kAccumulation,
                                  what + " vs float64");
          const blockgemm::Run cpu = blockgemm::run(FP8KIT_DEVICE_CPU, c);
          ASSERT_EQ(cpu.status, FP8KIT_OK) << cpu.error;
          std::vector<double> cpu_d(cpu.d.begin(), cpu.d.end());
          blockgemm::expect_close(gpu.d, cpu_d, sum_abs, 2 * rel, kAccumulation,
                                  what + " vs CPU");
        }
      }
    }
    seed += 10;
  }
}

#ifdef FP8KIT_WITH_CUDA
// White-box: block-scaled GEMMs get plans of their own in the one plan
// cache (the scaling modes are part of the key), reused by identical calls.
TEST(BlockScalingGpu, GemmsShareThePlanCache) {
  QTEST_SKIP_WITHOUT_GPU();
  int supported = 0;
  ASSERT_EQ(fp8kit_supports_block_scaled_fp8_gemm(FP8KIT_DEVICE_CUDA, 0, &supported), FP8KIT_OK);
  if (!supported) GTEST_SKIP() << "no block-scaled FP8 GEMM on this device";
  auto plans = [] { return fp8kit::cuda::gemm_plan_cache().size(); };
  Case c;  // a shape no other test uses
  c.a = blockgemm::make_operand(56, 176, FP8KIT_SCALING_BLOCK_1X128, FP8KIT_E4M3, 1);
  c.b = blockgemm::make_operand(152, 176, FP8KIT_SCALING_BLOCK_128X128, FP8KIT_E4M3, 2);
  const size_t before = plans();
  ASSERT_EQ(blockgemm::run(FP8KIT_DEVICE_CUDA, c).status, FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(plans(), before + 1);
  ASSERT_EQ(blockgemm::run(FP8KIT_DEVICE_CUDA, c).status, FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(plans(), before + 1) << "an identical call must reuse its plan";
  c.b = blockgemm::make_operand(152, 176, FP8KIT_SCALING_BLOCK_1X128, FP8KIT_E4M3, 2);
  ASSERT_EQ(blockgemm::run(FP8KIT_DEVICE_CUDA, c).status, FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(plans(), before + 2) << "another scaling mode is another plan";
}
#endif

}  // namespace
