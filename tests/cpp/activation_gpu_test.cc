// fp8kit_activation_forward / fp8kit_activation_backward on CUDA == CPU
// bit for bit: FP8 bytes (rowwise and columnwise), the scaling state, the
// high-precision output and the column sums, over GELU and SwiGLU, every
// input dtype, both recipes (fresh and seeded slots, recording or not),
// tile-border shapes (F not a multiple of the 128-column tile, so SwiGLU's
// halves meet inside a tile), specials in h, and two calls in a row on one
// state. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "activation_test_util.h"
#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "quant_test_util.h"

namespace {

const std::vector<std::vector<int64_t>> kGpuShapes = {
    {3, 5, 48}, {130, 144}, {257, 4096}, {129, 272}, {16, 14336}, {0, 32}, {1, 16}};

TEST(ActivationGpu, EqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (bool backward : {false, true}) {
      for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        for (const auto& shape : kGpuShapes) {
          for (fusedtest::CastSpec spec : fusedtest::cast_specs()) {
            spec.sums = backward && spec.columnwise && qtest::flat2d(shape).first > 1;
            spec.sums_dtype = dtype;
            const uint32_t case_seed = seed++;
            const acttest::ActInputs in = acttest::make_inputs(act, dtype, shape, case_seed,
                                                               /*specials=*/case_seed % 3 == 0);
            const std::string what = std::string(act == FP8KIT_GELU ? "GELU " : "SwiGLU ") +
                                     (backward ? "backward " : "forward ") +
                                     fp8kit_dtype_name(dtype) + " " + fusedtest::spec_name(spec) +
                                     " numel " + std::to_string(qtest::numel(shape));
            const acttest::ActResult cpu = acttest::run(FP8KIT_DEVICE_CPU, in, backward, spec, 2);
            const acttest::ActResult gpu = acttest::run(FP8KIT_DEVICE_CUDA, in, backward, spec, 2);
            ASSERT_EQ(cpu.status, FP8KIT_OK) << what << ": " << cpu.error;
            ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
            EXPECT_EQ(cpu.hp, gpu.hp) << what << ": high-precision output";
            fusedtest::expect_same_cast(cpu.cast, gpu.cast, what);
          }
        }
      }
    }
  }
}

}  // namespace
