// fp8kit_gemm's argument checks on the CPU (the same checks run before the
// CUDA path): one table of bad calls, each with the status and the part of
// the message (naming the operand and the fix) it must give.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "fp8kit/fp8kit.h"
#include "gemm_test_util.h"

namespace fp8kit_test {
namespace {

// A bad call: a valid default case changed by `setup` (before its inputs
// are made) and `edit` (the built descriptors), either may be NULL.
struct RejectCase {
  const char* name;
  void (*setup)(GemmCase&);
  void (*edit)(CpuCase&);
  const char* message;
};

std::ostream& operator<<(std::ostream& os, const RejectCase& c) { return os << c.name; }

const RejectCase kRejects[] = {
    // Which data an operand must hold.
    {"BReadTransposedWithoutColumnwiseData",
     [](GemmCase& c) { c.trans_b = 0; c.b_columnwise = false; }, nullptr,
     "gemm: B must be read transposed (trans_b=0) but B has no columnwise data; "
     "quantize B with columnwise=True"},
    {"AReadTransposedWithoutColumnwiseData",
     [](GemmCase& c) { c.trans_a = 1; c.trans_b = 0; c.a_columnwise = false; }, nullptr,
     "gemm: A must be read transposed (trans_a=1) but A has no columnwise data; "
     "quantize A with columnwise=True"},
    {"AWithoutRowwiseData",  // trans_a = 0 reads the rowwise data
     [](GemmCase& c) { c.a_rowwise = false; }, nullptr,
     "A has no rowwise data; quantize A with rowwise=True"},
    {"BWithoutAnyData", [](GemmCase& c) { c.b_rowwise = false; c.b_columnwise = false; }, nullptr,
     "B has neither rowwise data nor columnwise data"},
    // Sizes and formats.
    {"KNotAMultipleOf16", [](GemmCase& c) { c.m = 64; c.k = 17; }, nullptr,
     "FP8 GEMM needs K to be a multiple of 16"},
    {"E5m2TimesE5m2", [](GemmCase& c) { c.a_dtype = FP8KIT_E5M2; c.b_dtype = FP8KIT_E5M2; },
     nullptr, "A and B are both e5m2"},
    {"E5m2OutputFromE4m3Inputs", [](GemmCase& c) { c.d_dtype = FP8KIT_E5M2; }, nullptr,
     "D is e5m2 but A and B are both e4m3"},
    {"NonFp8Operand", nullptr, [](CpuCase& cc) { cc.args.a.dtype = FP8KIT_BFLOAT16; },
     "A has dtype bfloat16; FP8 GEMM operands must be e4m3"},
    {"UnknownScalingMode", nullptr,
     [](CpuCase& cc) { cc.args.b.scaling_mode = fp8kit_scaling_mode(7); },
     "B has an unknown scaling_mode (7)"},
    // Scales.
    {"OperandWithoutScaleInv", nullptr, [](CpuCase& cc) { cc.args.a.scale_inv = nullptr; },
     "A has no scale_inv"},
    {"Fp8OutputWithoutScale", [](GemmCase& c) { c.d_dtype = FP8KIT_E4M3; },
     [](CpuCase& cc) { cc.args.d.scale = nullptr; }, "D is e4m3 but has no scale"},
    // Alignment.
    {"MisalignedRowwiseData", nullptr,
     [](CpuCase& cc) { cc.args.a.data = static_cast<char*>(cc.args.a.data) + 1; },
     "A's data pointer"},
    {"MisalignedColumnwiseData", [](GemmCase& c) { c.trans_b = 0; },
     [](CpuCase& cc) {
       cc.args.b.columnwise_data = static_cast<char*>(cc.args.b.columnwise_data) + 8;
     },
     "B's columnwise data pointer"},
    {"MisalignedOutput", nullptr,
     [](CpuCase& cc) { cc.args.d.data = static_cast<char*>(cc.args.d.data) + 2; },
     "not 16-byte aligned"},
    {"Bf16OutputRowsNotWholeSixteenBytes", [](GemmCase& c) { c.n = 12; },  // 24 bytes
     nullptr, "N a multiple of 8 for bfloat16"},
    {"E4m3OutputRowsNotWholeSixteenBytes",
     [](GemmCase& c) { c.n = 24; c.d_dtype = FP8KIT_E4M3; }, nullptr,
     "N a multiple of 16 for e4m3"},
    // Shapes and config.
    {"InnerDimensionsDiffer", nullptr,
     [](CpuCase& cc) { cc.args.b.shape[1] = 80; },  // B is [N, 80] but A is [M, 64]
     "the inner dimensions must match"},
    {"OutputNotMByN", nullptr, [](CpuCase& cc) { cc.args.d.shape[0] = 32; },
     "D must be [M, N]"},
    {"ZeroK", nullptr,
     [](CpuCase& cc) { cc.args.a.shape[1] = 0; cc.args.b.shape[1] = 0; },
     "FP8 GEMM needs K > 0"},
    {"TransANotZeroOrOne", nullptr, [](CpuCase& cc) { cc.args.cfg.trans_a = 2; },
     "config.trans_a is 2"},
    {"BetaWithFp8Output", [](GemmCase& c) { c.d_dtype = FP8KIT_E4M3; },
     [](CpuCase& cc) { cc.args.cfg.beta = 1.0f; },
     "accumulating into D (beta != 0) needs a bfloat16"},
    // Bias and GELU auxiliary output.
    {"BiasDtypeNotTheOutputs",  // bf16 D takes a bf16 bias
     [](GemmCase& c) { c.epilogue = FP8KIT_EPILOGUE_BIAS; c.bias_dtype = FP8KIT_FLOAT16; },
     nullptr, "cuBLASLt takes a bfloat16 bias"},
    {"BiasNotN", [](GemmCase& c) { c.epilogue = FP8KIT_EPILOGUE_BIAS; },
     [](CpuCase& cc) { cc.args.cfg.bias_numel = cc.c.n + 1; }, "bias must be [N]"},
    {"BiasEpilogueWithoutBias", [](GemmCase& c) { c.epilogue = FP8KIT_EPILOGUE_BIAS; },
     [](CpuCase& cc) { cc.args.cfg.bias = nullptr; }, "config.bias is NULL"},
    {"BiasWithDefaultEpilogue", nullptr,  // DEFAULT would ignore it
     [](CpuCase& cc) { cc.args.cfg.bias = cc.h.bias.get(); }, "adds no bias"},
    {"GeluAuxWithoutGelu", [](GemmCase& c) { c.epilogue = FP8KIT_EPILOGUE_BIAS; },
     [](CpuCase& cc) { cc.args.cfg.gelu_aux = cc.h.aux.get(); }, "has no GELU"},
    {"GeluAuxWithFloat32Output",
     [](GemmCase& c) { c.epilogue = FP8KIT_EPILOGUE_GELU; c.d_dtype = FP8KIT_FLOAT32; },
     [](CpuCase& cc) { cc.args.cfg.gelu_aux = cc.h.aux.get(); },
     "needs a bfloat16 or float16 D"},
    {"GeluAuxNotMByN",
     [](GemmCase& c) { c.epilogue = FP8KIT_EPILOGUE_GELU; c.gelu_aux = true; },
     [](CpuCase& cc) { cc.args.cfg.gelu_aux_numel = 7; }, "gelu_aux must be [M, N]"},
};

class GemmRejects : public ::testing::TestWithParam<RejectCase> {};

TEST_P(GemmRejects, WithAMessageNamingTheArgument) {
  const RejectCase& r = GetParam();
  GemmCase c;
  if (r.setup != nullptr) r.setup(c);
  CpuCase cc(c);
  if (r.edit != nullptr) r.edit(cc);
  const GemmOutputs out = cc.run();
  EXPECT_EQ(out.status, FP8KIT_INVALID_ARGUMENT) << out.error;
  EXPECT_NE(out.error.find(r.message), std::string::npos) << "message was: " << out.error;
}

INSTANTIATE_TEST_SUITE_P(Cpu, GemmRejects, ::testing::ValuesIn(kRejects),
                         [](const ::testing::TestParamInfo<RejectCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(GemmCpu, RejectsNullArguments) {
  GemmCase c;
  CpuCase cc(c);
  fp8kit_tensor* none = nullptr;
  EXPECT_EQ(fp8kit_gemm(none, &cc.args.b, &cc.args.d, &cc.args.cfg, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("A descriptor is NULL"), std::string::npos);
  EXPECT_EQ(fp8kit_gemm(&cc.args.a, &cc.args.b, &cc.args.d, nullptr, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("config is NULL"), std::string::npos);
}

TEST(GemmCpu, RejectsOperandsOnDifferentDevices) {
  GemmCase c;
  CpuCase cc(c);
  cc.args.b.device_type = FP8KIT_DEVICE_CUDA;
  const GemmOutputs out = cc.run();
  EXPECT_NE(out.status, FP8KIT_OK);
  if (fp8kit_cuda_device_count() > 0) {
    EXPECT_NE(out.error.find("different devices"), std::string::npos) << out.error;
  } else {
    // No GPU (or no CUDA in this build): the CUDA operand itself is refused.
    EXPECT_NE(out.error.find("CUDA"), std::string::npos) << out.error;
  }
}

}  // namespace
}  // namespace fp8kit_test
