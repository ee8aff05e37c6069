// Block-scaled fp8kit_gemm on the CPU against a float64 GEMM of the
// dequantized operands: the forward, dgrad and wgrad layouts of a Linear
// layer and 128x128 x 1x128, with bfloat16 and float32 D, bias, alpha and
// beta; and every combination the block-scaled GEMM refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block_gemm_util.h"
#include "fp8kit/fp8kit.h"

namespace {

using blockgemm::Case;

// The CPU reference accumulates in float64 and rounds once: within half an
// ulp of D's dtype of the float64 result (plus float64 noise).
double rel_tolerance(fp8kit_dtype d) { return d == FP8KIT_FLOAT32 ? 0x1p-24 : 0x1p-8; }

TEST(BlockScalingGemm, CpuMatchesFloat64EveryLayout) {
  uint32_t seed = 1;
  for (auto shape : {std::vector<int64_t>{272, 320, 144}, {128, 128, 128}, {16, 16, 32}}) {
    for (Case c : blockgemm::layer_cases(shape[0], shape[1], shape[2], seed)) {
      for (fp8kit_dtype d : {FP8KIT_BFLOAT16, FP8KIT_FLOAT32}) {
        for (int variant = 0; variant < 3; ++variant) {
          c.d_dtype = d;
          c.bias = variant == 1;
          c.beta = variant == 2 ? 0.5f : 0.0f;
          c.alpha = variant == 2 ? -2.0f : 1.0f;
          const std::string what = blockgemm::case_name(c);
          std::vector<double> sum_abs;
          const std::vector<double> want = blockgemm::reference(c, &sum_abs);
          const blockgemm::Run got = blockgemm::run(FP8KIT_DEVICE_CPU, c);
          ASSERT_EQ(got.status, FP8KIT_OK) << what << ": " << got.error;
          blockgemm::expect_close(got.d, want, sum_abs, rel_tolerance(d), 1e-14, what);
        }
      }
    }
    seed += 10;
  }
}

// The block scales matter: a GEMM of the same bytes read with every scale
// doubled doubles D (so a reference that ignored the scales would fail).
TEST(BlockScalingGemm, ScalesAreApplied) {
  Case c = blockgemm::layer_cases(32, 256, 32, 7)[0];
  c.d_dtype = FP8KIT_FLOAT32;
  const blockgemm::Run base = blockgemm::run(FP8KIT_DEVICE_CPU, c);
  ASSERT_EQ(base.status, FP8KIT_OK) << base.error;
  for (float& s : c.a.rowwise.scales) s *= 2.0f;
  const blockgemm::Run doubled = blockgemm::run(FP8KIT_DEVICE_CPU, c);
  ASSERT_EQ(doubled.status, FP8KIT_OK) << doubled.error;
  for (size_t i = 0; i < base.d.size(); ++i) ASSERT_EQ(doubled.d[i], 2.0f * base.d[i]) << i;
}

// ------------------------------------------------------------ errors --

template <typename Edit>
void expect_refused(const Case& c, Edit edit, const std::string& needle,
                    fp8kit_status status = FP8KIT_INVALID_ARGUMENT) {
  const blockgemm::Run r = blockgemm::run(FP8KIT_DEVICE_CPU, c, edit);
  EXPECT_EQ(r.status, status) << blockgemm::case_name(c);
  EXPECT_NE(r.error.find(needle), std::string::npos)
      << "message: " << r.error << "\nexpected to mention: " << needle;
}

using Tensors = fp8kit_tensor;
using Config = fp8kit_gemm_config;

TEST(BlockScalingGemm, RefusesWhatCublasLtCannotRun) {
  const std::vector<Case> cases = blockgemm::layer_cases(32, 128, 48, 3);
  const Case& forward = cases[0];
  const auto none = [](Tensors&, Tensors&, Tensors&, Config&) {};
  {
    Case c = forward;
    c.a = blockgemm::make_operand(32, 128, FP8KIT_SCALING_BLOCK_128X128, FP8KIT_E4M3, 5);
    expect_refused(c, none, "both FP8KIT_SCALING_BLOCK_128X128");
  }
  {
    alignas(16) static float aligned_scale_inv[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    expect_refused(
        forward,
        [](Tensors& a, Tensors&, Tensors&, Config&) {
          a.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
          a.scale_inv = aligned_scale_inv;
        },
        "quantize A with fp8kit_quantize_block_scaling too");
  }
  expect_refused(
      forward, [](Tensors&, Tensors&, Tensors&, Config& c) { c.use_split_accumulator = 0; },
      "no fast-accumulation mode");
  expect_refused(
      forward, [](Tensors&, Tensors&, Tensors&, Config& c) { c.epilogue = FP8KIT_EPILOGUE_GELU; },
      "FP8KIT_EPILOGUE_DEFAULT or FP8KIT_EPILOGUE_BIAS only");
  {
    Case c = forward;
    c.d_dtype = FP8KIT_FLOAT16;
    expect_refused(c, none, "writes a bfloat16 or float32 D");
  }
  {
    // A 1x128 A needs M % 8 == 0; a 128x128 A does not.
    Case c = forward;
    c.a = blockgemm::make_operand(36, 128, FP8KIT_SCALING_BLOCK_1X128, FP8KIT_E4M3, 6);
    expect_refused(c, none, "M is 36");
    c.a = blockgemm::make_operand(36, 128, FP8KIT_SCALING_BLOCK_128X128, FP8KIT_E4M3, 6);
    c.b = blockgemm::make_operand(48, 128, FP8KIT_SCALING_BLOCK_1X128, FP8KIT_E4M3, 7);
    const blockgemm::Run r = blockgemm::run(FP8KIT_DEVICE_CPU, c);
    EXPECT_EQ(r.status, FP8KIT_OK) << r.error;
  }
  {
    Case c = forward;
    c.b = blockgemm::make_operand(44, 128, FP8KIT_SCALING_BLOCK_128X128, FP8KIT_E4M3, 8);
    c.d_dtype = FP8KIT_FLOAT32;  // D rows of 44 floats are 16-byte multiples
    expect_refused(c, none, "N is 44");
  }
  expect_refused(
      cases[1],  // dgrad reads w's columnwise copy
      [](Tensors&, Tensors& b, Tensors&, Config&) { b.columnwise_block_scale_inv = nullptr; },
      "B->columnwise_block_scale_inv is NULL");
  expect_refused(
      forward,
      [](Tensors& a, Tensors&, Tensors&, Config&) { a.block_scale_inv += 1; },
      "16-byte aligned");
}

TEST(BlockScalingGemm, CpuSupportsBlockScaledGemm) {
  int supported = -1;
  ASSERT_EQ(fp8kit_supports_block_scaled_fp8_gemm(FP8KIT_DEVICE_CPU, 0, &supported), FP8KIT_OK)
      << fp8kit_last_error();
  EXPECT_EQ(supported, 1);
  EXPECT_EQ(fp8kit_supports_block_scaled_fp8_gemm(FP8KIT_DEVICE_CPU, 0, nullptr),
            FP8KIT_INVALID_ARGUMENT);
}

}  // namespace
