// Choosing among cuBLASLt's heuristic candidates by timing them once on the
// real problem (the plan cache then reuses the choice for every later call).
#ifndef FP8KIT_CUDA_GEMM_AUTOTUNE_H_
#define FP8KIT_CUDA_GEMM_AUTOTUNE_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <vector>

#include "gemm_plan.h"
#include "gemm_problem.h"

namespace fp8kit {
namespace cuda {

// Returns the index of the fastest of `algos` (index 0, the heuristic's own
// first choice, unless another is at least 1% faster). Runs each candidate a
// few times on `stream` and waits for them; writes D (or a scratch D when
// beta != 0, so accumulation targets are not disturbed). Any failure while
// timing falls back to index 0: tuning never makes a GEMM fail. When
// `us_per_call` is not null it receives each candidate's best time in
// microseconds (infinity for one that did not run; empty after a failure).
int pick_fastest_algo(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const GemmPlan& plan,
                      const std::vector<cublasLtMatmulAlgo_t>& algos, const GemmProblem& p,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream,
                      std::vector<float>* us_per_call);

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GEMM_AUTOTUNE_H_
