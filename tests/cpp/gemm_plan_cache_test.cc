// The cuBLASLt GEMM's plan cache (white-box: its size is read from the
// core's internal cache, gemm_plan_cache.h): one plan per kind of GEMM,
// none for CPU GEMMs, reused by identical calls, safe under many threads
// and streams.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "gemm_test_util.h"
#ifdef FP8KIT_WITH_CUDA
#include "gemm_plan_cache.h"
#endif

namespace fp8kit_test {
namespace {

#ifdef FP8KIT_WITH_CUDA

size_t plan_count() { return fp8kit::cuda::gemm_plan_cache().size(); }

// Iterations per thread of the many-threads test: FP8KIT_STRESS_ITERATIONS
// when set to a positive number (the sanitizer stages set it lower: under
// racecheck each cuBLASLt launch takes a second or more), else `fallback`.
int stress_iterations(int fallback) {
  const char* text = std::getenv("FP8KIT_STRESS_ITERATIONS");
  const int n = text != nullptr ? std::atoi(text) : 0;
  return n > 0 ? n : fallback;
}

TEST(GemmPlanCacheCuda, CpuGemmsMakeNoPlans) {
  const size_t before = plan_count();
  GemmCase c;
  const GemmOutputs out = run_cpu(c);
  ASSERT_EQ(out.status, FP8KIT_OK) << out.error;
  EXPECT_EQ(plan_count(), before);
}

#define SKIP_WITHOUT_GPU()                                          \
  do {                                                              \
    if (fp8kit_cuda_device_count() == 0) GTEST_SKIP() << "no GPU";  \
  } while (0)

// Runs `c` on GPU 0 `times` times on the same buffers.
void run_repeatedly(const GemmCase& c, int times) {
  const GemmInputs in = make_inputs(c);
  HostSide h = host_side(c, in);
  DeviceCase dc(c, in, h);
  for (int i = 0; i < times; ++i) {
    ASSERT_EQ(call_gemm(c, FP8KIT_DEVICE_CUDA, 0, in, dc.buf, nullptr), FP8KIT_OK)
        << fp8kit_last_error();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(GemmPlanCacheCuda, IdenticalCallsReuseOnePlan) {
  SKIP_WITHOUT_GPU();
  GemmCase c;  // a shape no other test uses
  c.m = 72;
  c.n = 136;
  c.k = 208;
  const size_t before = plan_count();
  run_repeatedly(c, 1);
  const size_t after_first = plan_count();
  EXPECT_EQ(after_first, before + 1);
  run_repeatedly(c, 10);
  EXPECT_EQ(plan_count(), after_first) << "identical calls must not add plans";
}

TEST(GemmPlanCacheCuda, EachKindOfGemmGetsItsOwnPlan) {
  SKIP_WITHOUT_GPU();
  GemmCase c;
  c.m = 88;
  c.n = 160;  // a multiple of 16, so the FP8-output variant below is valid
  c.k = 224;
  size_t expected = plan_count();
  run_repeatedly(c, 2);
  EXPECT_EQ(plan_count(), ++expected);
  GemmCase other_m = c;
  other_m.m = 89;
  run_repeatedly(other_m, 2);
  EXPECT_EQ(plan_count(), ++expected) << "shape";
  GemmCase fast = c;
  fast.use_split_accumulator = 0;
  run_repeatedly(fast, 2);
  EXPECT_EQ(plan_count(), ++expected) << "accumulation mode";
  GemmCase bias = c;
  bias.epilogue = FP8KIT_EPILOGUE_BIAS;
  run_repeatedly(bias, 2);
  EXPECT_EQ(plan_count(), ++expected) << "epilogue";
  GemmCase fp8_out = c;
  fp8_out.d_dtype = FP8KIT_E4M3;
  run_repeatedly(fp8_out, 2);
  EXPECT_EQ(plan_count(), ++expected) << "output dtype";
  GemmCase layout = c;
  layout.trans_b = 0;  // B now comes from its columnwise copy: the canonical (TN) GEMM is the
  run_repeatedly(layout, 2);  // same, so is the plan
  EXPECT_EQ(plan_count(), expected) << "TN canonicalization";
}

// Many threads, each with its own stream (two share the legacy default
// stream), running GEMMs of a few kinds at once and checking every result.
TEST(GemmPlanCacheCuda, HammerFromManyThreads) {
  SKIP_WITHOUT_GPU();
  std::vector<GemmCase> kinds(3);
  kinds[0].m = 96;
  kinds[0].n = 160;
  kinds[0].k = 240;
  kinds[1] = kinds[0];
  kinds[1].m = 97;
  kinds[1].trans_a = 1;
  kinds[1].trans_b = 0;
  kinds[1].d_dtype = FP8KIT_FLOAT32;
  kinds[2] = kinds[0];
  kinds[2].d_dtype = FP8KIT_E4M3;
  kinds[2].epilogue = FP8KIT_EPILOGUE_GELU_BIAS;
  std::vector<std::unique_ptr<GemmInputs>> inputs;
  std::vector<Reference> refs;
  for (const GemmCase& c : kinds) {
    inputs.emplace_back(new GemmInputs(make_inputs(c)));
    refs.push_back(reference_gemm(c, *inputs.back()));
  }
  const size_t before = plan_count();

  constexpr int kThreads = 8;
  const int iterations = stress_iterations(40);
  std::atomic<int> failures{0};
  std::vector<std::string> first_error(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cudaSetDevice(0) != cudaSuccess) {
        ++failures;
        return;
      }
      cudaStream_t stream = nullptr;
      if (t >= 2 && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        ++failures;
        return;
      }
      // This thread's buffers, one set per kind, reused by every iteration
      // (GEMMs on one stream run in order, so a read sees the latest).
      std::vector<std::unique_ptr<HostSide>> hosts;
      std::vector<std::unique_ptr<DeviceCase>> devs;
      for (size_t kind = 0; kind < kinds.size(); ++kind) {
        hosts.emplace_back(new HostSide(host_side(kinds[kind], *inputs[kind])));
        devs.emplace_back(new DeviceCase(kinds[kind], *inputs[kind], *hosts.back()));
      }
      for (int i = 0; i < iterations; ++i) {
        const size_t kind = size_t(t + i) % kinds.size();
        const GemmCase& c = kinds[kind];
        const GemmInputs& in = *inputs[kind];
        HostSide& h = *hosts[kind];
        DeviceCase& dc = *devs[kind];
        const fp8kit_status st = call_gemm(c, FP8KIT_DEVICE_CUDA, 0, in, dc.buf, stream);
        if (st != FP8KIT_OK) {
          if (failures++ == 0) first_error[size_t(t)] = fp8kit_last_error();
          continue;
        }
        if (i % 4 != 0) continue;  // check every fourth result, keep the GPU busy otherwise
        GemmOutputs out;
        dc.read(c, h, stream, &out);
        const Reference& ref = refs[kind];
        for (size_t e = 0; e < out.d.size(); ++e) {
          const double tol = output_eps(c.d_dtype) * std::fabs(ref.d[e]) +
                             std::ldexp(1.0, -12) * ref.magnitude[e] +
                             output_abs_step(c.d_dtype, in.d_scale) +
                             std::ldexp(1.0, -10) * (std::fabs(ref.pre_gelu[e]) + 1.0);
          if (!(std::fabs(out.d[e] - ref.d[e]) <= tol)) {
            if (failures++ == 0) {
              first_error[size_t(t)] = c.name() + ": wrong element " + std::to_string(e);
            }
            break;
          }
        }
      }
      cudaStreamSynchronize(stream);
      devs.clear();
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  }
  for (auto& th : threads) th.join();
  std::string errors;
  for (const auto& e : first_error) {
    if (!e.empty()) errors += e + "\n";
  }
  EXPECT_EQ(failures.load(), 0) << errors;
  EXPECT_EQ(plan_count(), before + kinds.size());
}

#else

TEST(GemmPlanCacheCuda, SkippedWithoutCudaBuild) { GTEST_SKIP() << "fp8kit built without CUDA"; }

#endif  // FP8KIT_WITH_CUDA

}  // namespace
}  // namespace fp8kit_test
