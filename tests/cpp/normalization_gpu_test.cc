// fp8kit_norm_forward / fp8kit_norm_backward on CUDA == CPU bit for bit:
// FP8 bytes (rowwise and columnwise), the scaling state (scale,
// scale_inv, amax, history, seeded, counter), y, mean and rsigma, and dx,
// dgamma and dbeta, over LayerNorm and RMSNorm, every input dtype, both
// recipes (fresh and seeded slots, recording or not), tile-border row
// counts, hidden sizes up to 16384, and two calls in a row on one state.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "norm_test_util.h"
#include "quant_test_util.h"

namespace {

const std::vector<std::vector<int64_t>> kGpuShapes = {
    {3, 5, 64}, {130, 48}, {257, 4096}, {33, 16384}, {64, 14336}, {0, 64}, {1, 16},
    {1100, 64}};  // 1100 rows: three groups of tiles in the dgamma sum, the last cut

TEST(NormGpu, ForwardAndBackwardEqualCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (const auto& shape : kGpuShapes) {
        for (const fusedtest::CastSpec& spec : fusedtest::cast_specs()) {
          const normtest::NormInputs in = normtest::make_inputs(type, dtype, shape, seed++);
          const std::string what = std::string(type == FP8KIT_LAYERNORM ? "LayerNorm " : "RMSNorm ") +
                                   fp8kit_dtype_name(dtype) + " " + fusedtest::spec_name(spec) +
                                   " numel " + std::to_string(qtest::numel(shape));
          const normtest::ForwardResult cpu = normtest::run_forward(FP8KIT_DEVICE_CPU, in, spec, 2);
          const normtest::ForwardResult gpu = normtest::run_forward(FP8KIT_DEVICE_CUDA, in, spec, 2);
          ASSERT_EQ(cpu.status, FP8KIT_OK) << what << ": " << cpu.error;
          ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
          EXPECT_EQ(cpu.mean, gpu.mean) << what << ": mean";
          EXPECT_EQ(cpu.rsigma, gpu.rsigma) << what << ": rsigma";
          EXPECT_EQ(cpu.y, gpu.y) << what << ": y";
          fusedtest::expect_same_cast(cpu.cast, gpu.cast, what);
          const fp8kit_dtype grad = spec.current ? dtype : FP8KIT_FLOAT32;
          const normtest::BackwardResult bc = normtest::run_backward(FP8KIT_DEVICE_CPU, in, cpu, grad);
          const normtest::BackwardResult bg = normtest::run_backward(FP8KIT_DEVICE_CUDA, in, cpu, grad);
          ASSERT_EQ(bc.status, FP8KIT_OK) << what << ": " << bc.error;
          ASSERT_EQ(bg.status, FP8KIT_OK) << what << ": " << bg.error;
          EXPECT_EQ(bc.dx, bg.dx) << what << ": dx";
          EXPECT_EQ(bc.dgamma, bg.dgamma) << what << ": dgamma";
          EXPECT_EQ(bc.dbeta, bg.dbeta) << what << ": dbeta";
        }
      }
    }
  }
}

// Without a cast (y_fp8 and cast NULL) the kernel's values pass writes y,
// mean and rsigma alone: the CPU's bits.
TEST(NormGpu, WithoutCastEqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 500;
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (const auto& shape : kGpuShapes) {
        const normtest::NormInputs in = normtest::make_inputs(type, dtype, shape, seed++);
        const std::string what = std::string(type == FP8KIT_LAYERNORM ? "LayerNorm " : "RMSNorm ") +
                                 fp8kit_dtype_name(dtype) + " numel " +
                                 std::to_string(qtest::numel(shape));
        const fusedtest::CastSpec spec;
        const normtest::ForwardResult cpu =
            normtest::run_forward(FP8KIT_DEVICE_CPU, in, spec, 1, /*cast_output=*/false);
        const normtest::ForwardResult gpu =
            normtest::run_forward(FP8KIT_DEVICE_CUDA, in, spec, 1, /*cast_output=*/false);
        ASSERT_EQ(cpu.status, FP8KIT_OK) << what << ": " << cpu.error;
        ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
        EXPECT_EQ(cpu.mean, gpu.mean) << what << ": mean";
        EXPECT_EQ(cpu.rsigma, gpu.rsigma) << what << ": rsigma";
        EXPECT_EQ(cpu.y, gpu.y) << what << ": y";
      }
    }
  }
}

// Inputs with NaN and inf: NaN statistics and outputs come out with the
// same bits on both sides (canonical NaN), and the scale policy applies.
TEST(NormGpu, NonFiniteInputsEqualCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    normtest::NormInputs in = normtest::make_inputs(type, FP8KIT_FLOAT32, {40, 256}, 9);
    std::vector<float> x = qtest::random_values(40 * 256, 2.0f, 9, /*specials=*/true, /*nan=*/true);
    in.x = qtest::encode_input(x, FP8KIT_FLOAT32);
    for (const fusedtest::CastSpec& spec : fusedtest::cast_specs()) {
      const normtest::ForwardResult cpu = normtest::run_forward(FP8KIT_DEVICE_CPU, in, spec);
      const normtest::ForwardResult gpu = normtest::run_forward(FP8KIT_DEVICE_CUDA, in, spec);
      ASSERT_EQ(gpu.status, FP8KIT_OK) << gpu.error;
      EXPECT_EQ(cpu.mean, gpu.mean);
      EXPECT_EQ(cpu.rsigma, gpu.rsigma);
      EXPECT_EQ(cpu.y, gpu.y);
      fusedtest::expect_same_cast(cpu.cast, gpu.cast, fusedtest::spec_name(spec));
    }
  }
}

}  // namespace
