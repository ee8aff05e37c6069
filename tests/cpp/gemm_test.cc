// fp8kit_gemm: the CPU reference against a float64 GEMM written here, its
// TN canonicalization, and (on a GPU) the cuBLASLt GEMM against both. Its
// argument checks: gemm_errors_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "gemm_test_util.h"

namespace fp8kit_test {
namespace {

const fp8kit_dtype kOutputs[] = {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32, FP8KIT_E4M3};

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Checks a CPU result against the float64 reference: one rounding of the
// output (the CPU accumulates in double from the same decoded operands).
void expect_cpu_matches_reference(const GemmCase& c, const GemmInputs& in, const GemmOutputs& out) {
  ASSERT_EQ(out.status, FP8KIT_OK) << out.error;
  const Reference ref = reference_gemm(c, in);
  expect_close(out.d, ref.d, output_eps(c.d_dtype), {}, output_abs_step(c.d_dtype, in.d_scale), "D");
  if (c.gelu_aux) expect_close(out.aux, ref.pre_gelu, output_eps(c.d_dtype), {}, 1e-6, "gelu_aux");
  if (is_fp8_dtype(c.d_dtype)) {
    EXPECT_NEAR(out.amax, max_abs(ref.d), 1e-6 * max_abs(ref.d)) << "amax";
    EXPECT_EQ(out.scale_inv, 1.0f / in.d_scale) << "scale_inv";
  }
}

void run_and_check_cpu(const GemmCase& c) {
  SCOPED_TRACE(c.name());
  CpuCase cc(c);
  expect_cpu_matches_reference(c, cc.in, cc.run());
}

// ------------------------------------------------------------ CPU: math --

TEST(GemmCpu, EveryLayoutAndOutputDtype) {
  // (trans_a, trans_b): forward (0, 1), dgrad (0, 0), wgrad (1, 0), and (1, 1).
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (fp8kit_dtype d : kOutputs) {
        GemmCase c;
        c.m = 33;  // odd M: no alignment rule applies to it
        c.n = 48;
        c.k = 64;
        c.trans_a = ta;
        c.trans_b = tb;
        c.d_dtype = d;
        c.seed = uint32_t(10 + ta * 8 + tb * 4 + int(d));
        run_and_check_cpu(c);
      }
    }
  }
}

TEST(GemmCpu, MixedFormatsAndE5m2Output) {
  struct Formats {
    fp8kit_dtype a, b, d;
  };
  const Formats cases[] = {{FP8KIT_E4M3, FP8KIT_E5M2, FP8KIT_BFLOAT16},
                           {FP8KIT_E5M2, FP8KIT_E4M3, FP8KIT_FLOAT16},
                           {FP8KIT_E4M3, FP8KIT_E5M2, FP8KIT_E5M2},
                           {FP8KIT_E5M2, FP8KIT_E4M3, FP8KIT_E4M3}};
  for (const Formats& f : cases) {
    GemmCase c;
    c.a_dtype = f.a;
    c.b_dtype = f.b;
    c.d_dtype = f.d;
    c.trans_b = 0;  // dgrad-like: gradient (e5m2) times weight
    run_and_check_cpu(c);
  }
}

// Every (D dtype, bias dtype, epilogue, gelu_aux) combination cuBLASLt's
// FP8 table allows: the epilogue tests of the CPU reference and of the GPU
// run the same list.
std::vector<GemmCase> epilogue_cases() {
  struct Out {
    fp8kit_dtype d, bias;
  };
  const Out outs[] = {{FP8KIT_BFLOAT16, FP8KIT_BFLOAT16},
                      {FP8KIT_FLOAT16, FP8KIT_FLOAT16},
                      {FP8KIT_FLOAT32, FP8KIT_BFLOAT16},
                      {FP8KIT_E4M3, FP8KIT_BFLOAT16},
                      {FP8KIT_E4M3, FP8KIT_FLOAT16}};
  const fp8kit_epilogue eps[] = {FP8KIT_EPILOGUE_BIAS, FP8KIT_EPILOGUE_GELU,
                                 FP8KIT_EPILOGUE_GELU_BIAS};
  std::vector<GemmCase> cases;
  for (const Out& o : outs) {
    for (fp8kit_epilogue ep : eps) {
      for (int aux = 0; aux < 2; ++aux) {
        const bool aux_ok = o.d == FP8KIT_BFLOAT16 || o.d == FP8KIT_FLOAT16;
        if (aux && (!aux_ok || ep == FP8KIT_EPILOGUE_BIAS)) continue;
        GemmCase c;
        c.d_dtype = o.d;
        c.bias_dtype = o.bias;
        c.epilogue = ep;
        c.gelu_aux = aux != 0;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

TEST(GemmCpu, BiasAndGeluEpilogues) {
  for (GemmCase c : epilogue_cases()) {
    c.seed = 77;
    run_and_check_cpu(c);
  }
}

TEST(GemmCpu, AlphaAndBetaAccumulate) {
  for (fp8kit_dtype d : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32}) {
    GemmCase c;
    c.d_dtype = d;
    c.alpha = 2.0f;
    c.beta = 0.5f;
    c.trans_a = 1;  // wgrad accumulation: dW += dY^T X
    c.trans_b = 0;
    c.epilogue = FP8KIT_EPILOGUE_BIAS;
    c.bias_dtype = d == FP8KIT_FLOAT16 ? FP8KIT_FLOAT16 : FP8KIT_BFLOAT16;
    run_and_check_cpu(c);
  }
}

TEST(GemmCpu, AlphaScalesFp8Output) {
  GemmCase c;
  c.d_dtype = FP8KIT_E4M3;
  c.alpha = -0.75f;
  run_and_check_cpu(c);
}

TEST(GemmCpu, HigherRankOperandsAreFlattened) {
  // x [3, 11, 64] @ w[48, 64]^T -> y [3, 11, 48]: M = 33.
  GemmCase c;
  c.m = 33;
  c.n = 48;
  c.k = 64;
  CpuCase cc(c);
  cc.args.a.rank = 3;
  cc.args.a.shape[0] = 3;
  cc.args.a.shape[1] = 11;
  cc.args.a.shape[2] = 64;
  cc.args.d.rank = 3;
  cc.args.d.shape[0] = 3;
  cc.args.d.shape[1] = 11;
  cc.args.d.shape[2] = 48;
  expect_cpu_matches_reference(c, cc.in, cc.run());
}

TEST(GemmCpu, EmptyMWritesAmaxAndScaleInv) {
  GemmCase c;
  c.m = 0;
  c.d_dtype = FP8KIT_E4M3;
  CpuCase cc(c);
  cc.h.d_scale = 4.0f;
  const GemmOutputs out = cc.run();
  ASSERT_EQ(out.status, FP8KIT_OK) << out.error;
  EXPECT_EQ(out.amax, 0.0f);
  EXPECT_EQ(out.scale_inv, 0.25f);
}

// ------------------------------------------------- CPU: TN canonicalization --

TEST(GemmCpu, CapabilityQueryAnswersZeroOnCpu) {
  int supported = -1;
  ASSERT_EQ(fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CPU, 0, &supported), FP8KIT_OK);
  EXPECT_EQ(supported, 0);
}

// The CPU follows Hopper: an operand that is not K-contiguous as stored is
// read from its columnwise data, one that is K-contiguous from its rowwise
// data. Giving each copy different contents shows which one was read.
TEST(GemmCpu, ReadsColumnwiseDataExactlyWhenHopperWould) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      GemmCase c;
      c.trans_a = ta;
      c.trans_b = tb;
      c.seed = 5;
      CpuCase cc(c);
      // Second, different operands of the same shapes.
      GemmCase other = c;
      other.seed = 99;
      GemmInputs alt = make_inputs(other);
      // Rowwise data from `cc.in`, columnwise data from `alt`.
      cc.args.a.columnwise_data = alt.a.columnwise.get();
      cc.args.b.columnwise_data = alt.b.columnwise.get();
      const GemmOutputs out = cc.run();
      SCOPED_TRACE(c.name());
      ASSERT_EQ(out.status, FP8KIT_OK) << out.error;
      // Expected: A from columnwise (alt) iff trans_a, B from columnwise iff !trans_b.
      GemmInputs expect_in = make_inputs(c);
      if (ta) expect_in.a = make_inputs(other).a;
      if (!tb) expect_in.b = make_inputs(other).b;
      expect_in.bias = cc.in.bias;
      expect_cpu_matches_reference(c, expect_in, out);
    }
  }
}

TEST(GemmCpu, ColumnwiseOnlyOperandWorksWhereItIsRead) {
  GemmCase c;
  c.trans_a = 1;
  c.trans_b = 0;  // wgrad: both operands read from columnwise data
  c.a_rowwise = false;
  c.b_rowwise = false;
  run_and_check_cpu(c);
}

// The narrowest legal output rows (16 bytes): 8 bf16, 4 fp32. The
// rejections (gemm_errors_test.cc) are one element narrower.
TEST(GemmCpu, OutputRowsOfSixteenBytesWork) {
  GemmCase c;
  c.n = 24;
  run_and_check_cpu(c);
  c.n = 20;
  c.d_dtype = FP8KIT_FLOAT32;
  run_and_check_cpu(c);
}

TEST(GemmCpu, ConfigDefaultAndWorkspaceSize) {
  const fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
  EXPECT_EQ(cfg.alpha, 1.0f);
  EXPECT_EQ(cfg.beta, 0.0f);
  EXPECT_EQ(cfg.epilogue, FP8KIT_EPILOGUE_DEFAULT);
  EXPECT_EQ(cfg.use_split_accumulator, 1);
  EXPECT_EQ(cfg.workspace, nullptr);
  EXPECT_EQ(fp8kit_gemm_workspace_size(FP8KIT_DEVICE_CPU), 0u);
  if (fp8kit_built_with_cuda()) {
    EXPECT_GE(fp8kit_gemm_workspace_size(FP8KIT_DEVICE_CUDA), size_t(32) << 20);
  }
}

#ifdef FP8KIT_WITH_CUDA
// ------------------------------------------------------------- GPU: math --

#define SKIP_WITHOUT_GPU()                                          \
  do {                                                              \
    if (fp8kit_cuda_device_count() == 0) GTEST_SKIP() << "no GPU";  \
  } while (0)

// Hopper's FP8 tensor cores add partial products in a narrower-than-fp32
// accumulator; the split accumulator only promotes to fp32 every few K
// blocks, so within a block (and for K this small, over the whole product)
// the error is that of a ~13-bit accumulator. Measured on an H200 with fp32
// output: up to about 2^-14 * sum |a||b| with the split accumulator; the
// bound below leaves 8x margin. Fast accumulation promotes less often.
// Either way it is a fraction of sum |a||b|, on top of the output's own
// rounding; a layout or scale bug gives errors of order 1.
double accumulation_error(const GemmCase& c) {
  return c.use_split_accumulator ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

void expect_cuda_matches(const GemmCase& c) {
  SCOPED_TRACE(c.name());
  CpuCase cpu_case(c);
  const GemmOutputs cpu = cpu_case.run();
  ASSERT_EQ(cpu.status, FP8KIT_OK) << cpu.error;
  const GemmOutputs gpu = run_cuda(c, cpu_case.in);
  ASSERT_EQ(gpu.status, FP8KIT_OK) << gpu.error;
  const Reference ref = reference_gemm(c, cpu_case.in);
  const bool gelu = c.epilogue == FP8KIT_EPILOGUE_GELU || c.epilogue == FP8KIT_EPILOGUE_GELU_BIAS;
  std::vector<double> extra(ref.magnitude.size());
  for (size_t i = 0; i < extra.size(); ++i) {
    extra[i] = accumulation_error(c) * ref.magnitude[i] +
               (gelu ? std::ldexp(1.0, -10) * (std::fabs(ref.pre_gelu[i]) + 1.0) : 0.0);
  }
  const double eps = output_eps(c.d_dtype);
  const double step = output_abs_step(c.d_dtype, cpu_case.in.d_scale);
  expect_close(gpu.d, ref.d, eps, extra, step, "GPU D vs float64 reference");
  expect_close(gpu.d, cpu.d, 2 * eps, extra, 2 * step, "GPU D vs CPU D");
  if (c.gelu_aux) {
    std::vector<double> aux_extra(ref.magnitude.size());
    for (size_t i = 0; i < aux_extra.size(); ++i) aux_extra[i] = accumulation_error(c) * ref.magnitude[i];
    expect_close(gpu.aux, ref.pre_gelu, eps, aux_extra, 1e-6, "GPU gelu_aux vs reference");
  }
  if (is_fp8_dtype(c.d_dtype)) {
    const double want = max_abs(ref.d);
    EXPECT_NEAR(gpu.amax, want, (c.use_split_accumulator ? 1e-3 : 1e-2) * want) << "amax";
    EXPECT_EQ(gpu.scale_inv, 1.0f / cpu_case.in.d_scale) << "scale_inv";
  }
}

TEST(GemmCuda, CapabilityQueryMatchesTheCudaRule) {
  SKIP_WITHOUT_GPU();
  int cc = 0, supported = -1;
  ASSERT_EQ(fp8kit_cuda_compute_capability(0, &cc), FP8KIT_OK);
  ASSERT_EQ(fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CUDA, 0, &supported), FP8KIT_OK);
  std::printf("[ info ] CUDA device 0: compute capability %d, supports non-TN FP8 GEMM: %d\n", cc,
              supported);
  if (cc == 89 || cc == 90 || cc == 120 || cc == 121) {
    EXPECT_EQ(supported, 0);
  }
  if (cc == 100 || cc == 103) {
    EXPECT_EQ(supported, 1);
  }
}

TEST(GemmCuda, EveryLayoutOutputAndAccumulationMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (fp8kit_dtype d : kOutputs) {
        for (int split = 0; split < 2; ++split) {
          GemmCase c;
          c.m = 33;
          c.n = 48;
          c.k = 96;
          c.trans_a = ta;
          c.trans_b = tb;
          c.d_dtype = d;
          c.use_split_accumulator = split;
          c.seed = uint32_t(100 + ta * 16 + tb * 8 + int(d) * 2 + split);
          expect_cuda_matches(c);
        }
      }
    }
  }
}

TEST(GemmCuda, EpiloguesMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (GemmCase c : epilogue_cases()) {
    c.m = 40;
    c.n = 64;
    c.k = 128;
    expect_cuda_matches(c);
  }
}

TEST(GemmCuda, AlphaBetaAndMixedFormatsMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (fp8kit_dtype d : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16, FP8KIT_FLOAT32}) {
    GemmCase c;
    c.d_dtype = d;
    c.alpha = 2.0f;
    c.beta = 0.5f;
    c.trans_a = 1;
    c.trans_b = 0;
    expect_cuda_matches(c);
  }
  GemmCase mixed;
  mixed.a_dtype = FP8KIT_E5M2;
  mixed.trans_b = 0;
  expect_cuda_matches(mixed);
  mixed.d_dtype = FP8KIT_E5M2;
  expect_cuda_matches(mixed);
  mixed.a_dtype = FP8KIT_E4M3;
  mixed.b_dtype = FP8KIT_E5M2;
  mixed.d_dtype = FP8KIT_E4M3;
  mixed.alpha = -0.5f;
  expect_cuda_matches(mixed);
}

TEST(GemmCuda, ColumnwiseOnlyOperandsAndNarrowOutputs) {
  SKIP_WITHOUT_GPU();
  GemmCase c;
  c.trans_a = 1;
  c.trans_b = 0;
  c.a_rowwise = false;
  c.b_rowwise = false;
  expect_cuda_matches(c);
  GemmCase narrow;  // smallest legal rows of D: 8 bf16, 4 fp32, 16 e4m3
  narrow.n = 24;
  expect_cuda_matches(narrow);
  narrow.n = 20;
  narrow.d_dtype = FP8KIT_FLOAT32;
  expect_cuda_matches(narrow);
  narrow.n = 16;
  narrow.m = 1;
  narrow.d_dtype = FP8KIT_E4M3;
  expect_cuda_matches(narrow);
}

TEST(GemmCuda, LargerProblemMatchesReference) {
  SKIP_WITHOUT_GPU();
  GemmCase c;
  c.m = 256;
  c.n = 384;
  c.k = 1024;
  expect_cuda_matches(c);
  c.use_split_accumulator = 0;
  c.d_dtype = FP8KIT_E4M3;
  expect_cuda_matches(c);
}

TEST(GemmCuda, CallerWorkspaceGivesTheSameAnswer) {
  SKIP_WITHOUT_GPU();
  GemmCase c;
  c.m = 64;
  c.n = 128;
  c.k = 256;
  const GemmInputs in = make_inputs(c);
  const size_t bytes = fp8kit_gemm_workspace_size(FP8KIT_DEVICE_CUDA);
  DeviceBuffer ws(bytes);
  const GemmOutputs own = run_cuda(c, in);
  const GemmOutputs given = run_cuda(c, in, 0, nullptr, ws.get(), bytes);
  const GemmOutputs small = run_cuda(c, in, 0, nullptr, ws.get(), 1 << 20);
  ASSERT_EQ(own.status, FP8KIT_OK) << own.error;
  ASSERT_EQ(given.status, FP8KIT_OK) << given.error;
  ASSERT_EQ(small.status, FP8KIT_OK) << small.error;
  const Reference ref = reference_gemm(c, in);
  std::vector<double> extra(ref.magnitude.size());
  for (size_t i = 0; i < extra.size(); ++i) extra[i] = std::ldexp(1.0, -14) * ref.magnitude[i];
  expect_close(given.d, ref.d, output_eps(c.d_dtype), extra, 0.0, "caller workspace");
  expect_close(small.d, ref.d, output_eps(c.d_dtype), extra, 0.0, "1 MiB caller workspace");
  expect_close(own.d, ref.d, output_eps(c.d_dtype), extra, 0.0, "fp8kit's workspace");
}

TEST(GemmCuda, RejectsBadWorkspaceAndMixedDevices) {
  SKIP_WITHOUT_GPU();
  GemmCase c;
  const GemmInputs in = make_inputs(c);
  DeviceBuffer ws(1 << 20);
  GemmOutputs out = run_cuda(c, in, 0, nullptr, static_cast<char*>(ws.get()) + 16, 1 << 19);
  EXPECT_EQ(out.status, FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(out.error.find("not 256-byte aligned"), std::string::npos) << out.error;
  out = run_cuda(c, in, 0, nullptr, nullptr, 1 << 19);
  EXPECT_EQ(out.status, FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(out.error.find("config.workspace is NULL"), std::string::npos) << out.error;

  // A on the CPU, B and D on the GPU.
  CpuCase cc(c);
  HostSide h = host_side(c, cc.in);
  DeviceCase dc(c, cc.in, h);
  GemmArgs g = make_args(c, FP8KIT_DEVICE_CUDA, 0, cc.in, dc.buf);
  g.a = cc.args.a;
  EXPECT_EQ(g.call(), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("A and B are on different devices"),
            std::string::npos)
      << fp8kit_last_error();
}

TEST(GemmCuda, EmptyMWritesAmaxAndScaleInv) {
  SKIP_WITHOUT_GPU();
  GemmCase c;
  c.m = 0;
  c.d_dtype = FP8KIT_E4M3;
  GemmInputs in = make_inputs(c);
  in.d_scale = 4.0f;
  const GemmOutputs out = run_cuda(c, in);
  ASSERT_EQ(out.status, FP8KIT_OK) << out.error;
  EXPECT_EQ(out.amax, 0.0f);
  EXPECT_EQ(out.scale_inv, 0.25f);
}
#endif  // FP8KIT_WITH_CUDA

}  // namespace
}  // namespace fp8kit_test
