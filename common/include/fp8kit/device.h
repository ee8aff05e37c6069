/* Device capability queries.
 *
 * fp8kit_supports_non_tn_fp8_gemm answers whether cuBLASLt on a device runs
 * FP8 GEMMs in layouts other than TN (A transposed, B not, in cuBLAS's
 * column-major terms; in row-major terms: both operands K-contiguous).
 * cuBLASLt's rule: Ada (sm_89) and Hopper (sm_90) run FP8 GEMMs in TN only;
 * data-center Blackwell (sm_100, sm_103) and sm_110 also run NN, NT and TT.
 * The GeForce/workstation Blackwell parts (sm_120, sm_121) use Ada-style
 * tensor cores and cuBLASLt keeps them TN-only, so the answer is 1 exactly
 * for compute capability 10.0-11.x and 13.0 or later. A CPU "device" has no
 * cuBLASLt and answers 0, so the CPU reference exercises the same
 * columnwise-data path Hopper uses.
 *
 * The answer is computed once per device (std::call_once per ordinal) and
 * cached, so the GEMM path may call it on every GEMM. This is the only copy
 * of the rule: the JAX and PyTorch layers call it and keep none. */
#ifndef FP8KIT_DEVICE_H_
#define FP8KIT_DEVICE_H_

#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *supported = 1 if FP8 GEMMs on (device_type, device_index) accept non-TN
 * layouts, else 0. Fails for a CUDA ordinal that does not exist or a build
 * without CUDA. */
FP8KIT_API fp8kit_status fp8kit_supports_non_tn_fp8_gemm(fp8kit_device_type device_type,
                                                         int device_index, int* supported);

/* *supported = 1 if (device_type, device_index) runs block-scaled FP8 GEMMs
 * (fp8kit/block_scaling.h), else 0. cuBLASLt has them on Hopper only
 * (compute capability 9.0; Blackwell uses the MX formats instead) from
 * cuBLASLt 12.9 on, so a CUDA device answers 1 when its compute capability
 * is 9.0 and fp8kit was both built against and is running with cuBLASLt
 * 12.9 or newer. The CPU reference answers 1. Cached per device like the
 * non-TN answer; fp8kit_gemm refuses block-scaled operands where this is 0,
 * with a message naming the device's capability and cuBLASLt version. */
FP8KIT_API fp8kit_status fp8kit_supports_block_scaled_fp8_gemm(fp8kit_device_type device_type,
                                                               int device_index, int* supported);

/* Compute capability of a CUDA device as major*10+minor (90 for H100/H200). */
FP8KIT_API fp8kit_status fp8kit_cuda_compute_capability(int device_index, int* capability);

/* Number of CUDA devices visible (0 in a CPU-only build or with no driver). */
FP8KIT_API int fp8kit_cuda_device_count(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_DEVICE_H_ */
