// fp8kit::cuda::gemm: one cublasLtMatmul per call, with the plan (layouts and
// algorithm) from the plan cache, the calling thread's handle, and the
// caller's workspace or fp8kit's own per-(device, stream) one.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>

#include "cuda_backend.h"
#include "error.h"
#include "gemm_check.h"
#include "gemm_kernels.h"
#include "gemm_plan.h"
#include "gemm_plan_cache.h"
#include "gemm_problem.h"
#include "gemm_resources.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

// M == 0 or N == 0: no product to compute, but an FP8 D still gets its amax
// (0, as on the CPU) and scale_inv.
void finish_empty_gemm(const GemmProblem& p, cudaStream_t stream) {
  if (!is_fp8(p.d_dtype)) return;
  if (p.d_amax != nullptr) {
    gemm_cuda_check(cudaMemsetAsync(p.d_amax, 0, sizeof(float), stream), "cudaMemsetAsync(amax)");
  }
  if (p.d_scale_inv != nullptr) launch_gemm_scale_inv(p.d_scale, p.d_scale_inv, stream);
}

}  // namespace

void gemm(const GemmProblem& p, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceGuard device_guard(p.device_index);
  if (p.m == 0 || p.n == 0) {
    finish_empty_gemm(p, stream);
    return;
  }
  void* workspace = p.workspace;
  size_t workspace_bytes = p.workspace_bytes;
  if (workspace == nullptr) {
    workspace = default_workspace(p.device_index, stream);
    workspace_bytes = kGemmWorkspaceBytes;
  }
  cublasLtHandle_t handle = thread_handle(p.device_index);

  const GemmPlanKey key = make_plan_key(p, workspace_bytes);
  cublasLtMatmulDescOpaque_t desc;
  init_matmul_desc(p, key, &desc);

  GemmPlanCache& cache = gemm_plan_cache();
  const GemmPlan* plan = cache.find(key);
  std::unique_ptr<GemmPlan> provisional;
  if (plan == nullptr) {
    std::unique_ptr<GemmPlan> built =
        build_plan(handle, &desc, p, key, workspace, workspace_bytes, stream);
    if (built->provisional) {
      provisional = std::move(built);
      plan = provisional.get();
    } else {
      plan = cache.insert(key, std::move(built));
    }
  }
  cublas_check(run_matmul(handle, &desc, *plan, plan->algo, p, p.d, workspace, workspace_bytes,
                          stream),
               "cublasLtMatmul");
  if (p.d_scale_inv != nullptr) launch_gemm_scale_inv(p.d_scale, p.d_scale_inv, stream);
}

size_t gemm_workspace_size() { return kGemmWorkspaceBytes; }

}  // namespace cuda
}  // namespace fp8kit
