/* FP8 GEMM with per-tensor or block scaling.
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
 * Alignment rules of FP8 cuBLASLt, enforced on the CPU too: K must be a
 * multiple of 16 (and > 0); each row of D must be a multiple of 16 bytes (N a
 * multiple of 16 for FP8 D, 8 for bf16/fp16 D, 4 for fp32 D); on devices that
 * read an operand non-K-contiguous (sm_100), that operand's M or N must be a
 * multiple of 16 too; every data pointer (A, B, D, bias, gelu_aux) must be
 * 16-byte aligned.
 *
 * Type combinations are cuBLASLt's: E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3;
 * an E5M2 D needs one E5M2 operand. Bias dtype by D dtype: bf16 D -> bf16,
 * fp16 D -> fp16, fp32 D -> bf16, FP8 D -> bf16 or fp16.
 *
 * Block scaling (fp8kit/block_scaling.h): when A and B are both
 * block-scaled, each element is dequantized with its block's scale_inv,
 *   D[i,j] = alpha * sum_k (op(A)[i,k] * sa(i,k)) (op(B)[k,j] * sb(k,j)) (+ ...)
 * on cuBLASLt's Hopper kernels (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for
 * 1x128, BLK128x128_32F for 128x128). Both operands are always read
 * K-contiguous, from the copy TN canonicalization picks, with that copy's
 * block scales (block_scale_inv or columnwise_block_scale_inv), so a
 * Linear layer quantizes x and dy 1x128 with both copies and w 128x128:
 *   forward  y  = x @ w^T   A = x  1x128 rowwise,    B = w  128x128 rowwise
 *   dgrad    dx = dy @ w    A = dy 1x128 rowwise,    B = w  128x128 columnwise
 *   wgrad    dw = dy^T @ x  A = dy 1x128 columnwise, B = x  1x128 columnwise
 * Rules on top of the ones above, enforced on the CPU too: both operands
 * block-scaled (not one per-tensor), not both 128x128; D bf16 or fp32; the
 * DEFAULT or BIAS epilogue; use_split_accumulator = 1; N a multiple of 8,
 * and M too when A is 1x128; block scales 16-byte aligned; and a device
 * where fp8kit_supports_block_scaled_fp8_gemm answers 1 (else
 * FP8KIT_UNSUPPORTED naming the device's capability and cuBLASLt version). */
#ifndef FP8KIT_GEMM_H_
#define FP8KIT_GEMM_H_

#include <stddef.h>

#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each row of D is a multiple of this many bytes (see above). */
#define FP8KIT_GEMM_ROW_BYTES_MULTIPLE 16
/* A block-scaled GEMM's N, and M when A is 1x128, are multiples of this. */
#define FP8KIT_BLOCK_GEMM_MN_MULTIPLE 8

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
  const void* bias;       /* [N], dtype bias_dtype (see the table above); NULL unless a BIAS epilogue */
  fp8kit_dtype bias_dtype;
  /* GELU epilogues: when non-NULL, the pre-GELU value is stored here as
   * [M,N] row-major in D's dtype for the backward pass; D must then be
   * bf16 or fp16. */
  void* gelu_aux;
  /* 1: promote partial sums to FP32 every few K steps (more accurate);
   * 0: fast accumulation in the tensor core's native precision. */
  int use_split_accumulator;
  /* Device memory for cuBLASLt, 256-byte aligned, ideally
   * fp8kit_gemm_workspace_size() bytes. NULL with size 0: fp8kit uses its own
   * workspace of that size, allocated once per (device, stream) on first use
   * and kept for the life of the process. Ignored on CPU. */
  void* workspace;
  size_t workspace_bytes;
  /* Element counts of bias and gelu_aux, checked against N and M*N when
   * > 0 (0 = not given, not checked). Front ends should always set them. */
  int64_t bias_numel;
  int64_t gelu_aux_numel;
} fp8kit_gemm_config;

/* A config with alpha = 1, no epilogue and split accumulation on. */
FP8KIT_API fp8kit_gemm_config fp8kit_gemm_config_default(void);

/* Recommended workspace size in bytes for the CUDA GEMM (0 on CPU). */
FP8KIT_API size_t fp8kit_gemm_workspace_size(fp8kit_device_type device_type);

/* a, b: E4M3 or E5M2 (mixed allowed except E5M2 x E5M2), PER_TENSOR with
 *       scale_inv, or both block-scaled with the block scales of the copies
 *       read, and the data the layout needs (see TN canonicalization).
 * d:    [M,N] bf16, fp16 or fp32; or E4M3/E5M2 with d->scale (read) and, when
 *       non-NULL, d->amax (written: max |D| before quantization) and
 *       d->scale_inv (written).
 * All on one device. `stream` is a cudaStream_t or NULL. */
FP8KIT_API fp8kit_status fp8kit_gemm(const fp8kit_tensor* a, const fp8kit_tensor* b,
                                     fp8kit_tensor* d, const fp8kit_gemm_config* config,
                                     void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_GEMM_H_ */
