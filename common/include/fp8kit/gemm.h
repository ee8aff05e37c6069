/* FP8 GEMM with per-tensor scaling.
 *
 * Row-major semantics, as in NumPy and PyTorch:
 *   D[M,N] = alpha * (op(A) * a.scale_inv) @ (op(B) * b.scale_inv)
 *            (+ beta * D_old) (+ bias[N]) (then GELU)
 *   op(A) = A      [M,K]  when trans_a == 0 (A's rowwise data is [M,K])
 *           A^T           when trans_a == 1 (A's rowwise data is [K,M])
 *   op(B) = B      [K,N]  when trans_b == 0 (B's rowwise data is [K,N])
 *           B^T           when trans_b == 1 (B's rowwise data is [N,K])
 * A Linear layer y = x @ w^T is (A=x, trans_a=0, B=w, trans_b=1); its dgrad
 * dx = dy @ w is (A=dy, 0, B=w, 0) and its wgrad dw = dy^T @ x is
 * (A=dy, 1, B=x, 0).
 *
 * TN canonicalization: FP8 tensor cores read both operands K-contiguous
 * (A as [M,K], B as [N,K], "TN" in cuBLAS's column-major terms). When
 * fp8kit_supports_non_tn_fp8_gemm says the device cannot do otherwise (all
 * Hopper and Ada GPUs, and the CPU reference, which follows the same rule),
 * an operand whose rowwise data is not K-contiguous is read from its
 * columnwise data, which is exactly that transpose. Missing columnwise data
 * is an error naming the operand.
 *
 * Alignment rules of FP8 cuBLASLt, enforced on the CPU too: K, and N when D
 * is FP8, must be multiples of 16; every data pointer 16-byte aligned. */
#ifndef FP8KIT_GEMM_H_
#define FP8KIT_GEMM_H_

#include <stddef.h>

#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fp8kit_epilogue {
  FP8KIT_EPILOGUE_DEFAULT = 0,
  FP8KIT_EPILOGUE_BIAS = 1,      /* D += bias[N] */
  FP8KIT_EPILOGUE_GELU = 2,      /* D = gelu(D) (tanh approximation) */
  FP8KIT_EPILOGUE_GELU_BIAS = 3  /* D = gelu(D + bias[N]) */
} fp8kit_epilogue;

typedef struct fp8kit_gemm_config {
  int trans_a;            /* see above */
  int trans_b;
  float alpha;            /* 1 for a plain product */
  float beta;             /* 0, or accumulate into D's old contents (D not FP8) */
  fp8kit_epilogue epilogue;
  const void* bias;       /* [N], dtype bias_dtype (bf16, or fp16/fp32 matching D); NULL unless a BIAS epilogue */
  fp8kit_dtype bias_dtype;
  /* GELU epilogues: when non-NULL, the pre-GELU value is stored here as
   * [M,N] row-major in D's dtype (bf16/fp16) for the backward pass. */
  void* gelu_aux;
  /* 1: promote partial sums to FP32 every few K steps (more accurate);
   * 0: fast accumulation in the tensor core's native precision. */
  int use_split_accumulator;
  void* workspace;        /* device memory for cuBLASLt; may be NULL with size 0 */
  size_t workspace_bytes;
} fp8kit_gemm_config;

/* A config with alpha = 1, no epilogue and split accumulation on. */
FP8KIT_API fp8kit_gemm_config fp8kit_gemm_config_default(void);

/* Recommended workspace size in bytes for the CUDA GEMM (0 on CPU). */
FP8KIT_API size_t fp8kit_gemm_workspace_size(fp8kit_device_type device_type);

/* a, b: E4M3 or E5M2 (mixed allowed except E5M2 x E5M2), PER_TENSOR, with
 *       scale_inv and the data the layout needs (see TN canonicalization).
 * d:    [M,N] bf16, fp16 or fp32; or E4M3/E5M2 with d->scale (read) and, when
 *       non-NULL, d->amax (written: max |D| before quantization) and
 *       d->scale_inv (written).
 * All on one device. `stream` is a cudaStream_t or NULL. */
FP8KIT_API fp8kit_status fp8kit_gemm(const fp8kit_tensor* a, const fp8kit_tensor* b,
                                     fp8kit_tensor* d, const fp8kit_gemm_config* config,
                                     void* stream);

/* Number of cached GEMM plans (for tests of the plan cache). */
FP8KIT_API size_t fp8kit_gemm_plan_cache_size(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_GEMM_H_ */
