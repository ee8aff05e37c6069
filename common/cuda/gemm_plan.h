// A cuBLASLt GEMM plan: the matrix layouts and the chosen algorithm for one
// kind of GEMM, and how a GemmProblem maps onto cuBLASLt.
//
// Mapping. fp8kit is row-major: D[M,N] = op(A)[M,K] op(B)[K,N]. A row-major
// matrix is its transpose in column-major, so fp8kit asks cuBLASLt for
//   D^T[N,M] = op(B)^T[N,K] op(A)^T[K,M]
// i.e. cuBLASLt's "A" is our B, its "B" is our A, m = N, n = M, k = K. A
// K-major (TN) operand of ours is stored [rows, K] row-major = [K, rows]
// column-major, which cuBLASLt reads as TRANSA = T (for our B) and TRANSB = N
// (for our A): exactly the TN layout Hopper requires. D^T is column-major
// [N, M] with ld = N, i.e. our row-major D; bias[N] is cuBLASLt's per-row
// bias; gelu_aux is laid out like D.
//
// What goes into a plan and what does not. Everything that changes which
// kernel can run (shapes, dtypes, layouts, epilogue, whether amax is
// written, pointer alignment, accumulation mode, beta != 0, workspace size)
// is in GemmPlanKey, the operands' scaling modes included (block-scaled
// operands set cuBLASLt's A/B scale modes to VEC128_32F or BLK128x128_32F,
// and the scale pointers then point at the block scales). Per-call
// pointers (scales, bias, aux, amax) are not:
// the matmul descriptor that carries them is rebuilt on the stack for every
// call (cublasLtMatmulDescInit, no allocation), so threads sharing a plan
// never write to shared state.
#ifndef FP8KIT_CUDA_GEMM_PLAN_H_
#define FP8KIT_CUDA_GEMM_PLAN_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gemm_problem.h"

namespace fp8kit {
namespace cuda {

struct GemmPlanKey {
  int device;
  int64_t m, n, k;
  int32_t a_dtype, b_dtype, d_dtype, c_dtype, bias_dtype;  // cudaDataType values
  bool a_k_major, b_k_major;
  int32_t a_scaling_mode, b_scaling_mode;  // fp8kit_scaling_mode
  int32_t epilogue;  // fp8kit_epilogue
  bool has_bias, has_gelu_aux, has_amax;
  uint32_t align_a, align_b, align_d;  // bytes, power of two up to 256
  bool fast_accumulation;
  bool beta_nonzero;
  size_t workspace_bytes;

  bool operator==(const GemmPlanKey& o) const;
};

struct GemmPlanKeyHash {
  size_t operator()(const GemmPlanKey& key) const;
};

struct GemmPlan {
  // Layouts in cuBLASLt's terms (see the mapping above); read-only once
  // built, so plans are shared across threads.
  cublasLtMatrixLayoutOpaque_t layout_a;  // our B
  cublasLtMatrixLayoutOpaque_t layout_b;  // our A
  cublasLtMatrixLayoutOpaque_t layout_c;
  cublasLtMatrixLayoutOpaque_t layout_d;
  cublasLtMatmulAlgo_t algo;
  size_t algo_workspace_bytes;
  int candidates;   // heuristic results that could run
  int chosen;       // index of the chosen one among them (0 = the heuristic's first)
  bool timed;       // chosen by timing the candidates on first use
  bool provisional; // made under CUDA graph capture without timing: not cached
};

GemmPlanKey make_plan_key(const GemmProblem& p, size_t workspace_bytes);

// Initializes `desc` (stack storage) for one call: types, transposes,
// accumulation mode, epilogue, and this call's scale/bias/aux/amax pointers.
void init_matmul_desc(const GemmProblem& p, const GemmPlanKey& key,
                      cublasLtMatmulDescOpaque_t* desc);

// Builds a plan: layouts, then cublasLtMatmulAlgoGetHeuristic for several
// candidates (FP8KIT_GEMM_CANDIDATES, default 32), then (unless
// FP8KIT_GEMM_AUTOTUNE=0, or the stream is being captured into a CUDA
// graph, or there is one candidate) times them once on this problem and
// keeps the fastest. Runs the GEMM several times while
// timing; D (or, when beta != 0, a scratch copy of D) is overwritten, so the
// caller must run the real GEMM afterwards.
std::unique_ptr<GemmPlan> build_plan(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                     const GemmProblem& p, const GemmPlanKey& key,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream);

// One cublasLtMatmul with the plan. `d` overrides p.d (used while timing).
cublasStatus_t run_matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const GemmPlan& plan,
                          const cublasLtMatmulAlgo_t& algo, const GemmProblem& p, void* d,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GEMM_PLAN_H_
