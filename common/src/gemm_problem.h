// The validated, TN-canonicalized form of an fp8kit_gemm call, shared by the
// CPU reference (gemm_cpu.cc) and the cuBLASLt path (common/cuda/gemm_*.cc):
// every rule about what a GEMM may be is applied once, in make_gemm_problem,
// so whatever the CPU accepts the GPU runs and vice versa.
#ifndef FP8KIT_SRC_GEMM_PROBLEM_H_
#define FP8KIT_SRC_GEMM_PROBLEM_H_

#include <cstddef>
#include <cstdint>

#include "fp8kit/gemm.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// One FP8 operand as the GEMM reads it. `rows` is M for A and N for B.
//   k_major:  data is row-major [rows, K]   (K contiguous: the "TN" side)
//   !k_major: data is row-major [K, rows]   (only on devices that run non-TN)
struct GemmOperand {
  const void* data;
  fp8kit_dtype dtype;
  fp8kit_scaling_mode scaling_mode;  // PER_TENSOR, BLOCK_1X128 or BLOCK_128X128
  // Dequantization factors on the device: one float (PER_TENSOR), or the
  // block scales of the copy in `data` (block scaling; always K-major then,
  // in the layout of fp8kit/block_scaling.h for the copy [rows, K]).
  const float* scale_inv;
  bool k_major;
  bool from_columnwise;    // data is the tensor's columnwise copy
};

struct GemmProblem {
  fp8kit_device_type device_type;
  int device_index;
  int64_t m, n, k;
  GemmOperand a;  // rows = M
  GemmOperand b;  // rows = N
  // D: row-major [M, N].
  void* d;
  fp8kit_dtype d_dtype;
  const float* d_scale;  // FP8 D only
  float* d_amax;         // FP8 D only, may be NULL
  float* d_scale_inv;    // FP8 D only, may be NULL
  float alpha;
  float beta;
  fp8kit_epilogue epilogue;
  const void* bias;  // [N] when the epilogue has a bias, else NULL
  fp8kit_dtype bias_dtype;
  void* gelu_aux;    // [M, N] in d_dtype, or NULL
  bool fast_accumulation;
  void* workspace;   // NULL: use fp8kit's own (CUDA only)
  size_t workspace_bytes;
  // Whether a new plan may time cuBLASLt's candidates (gemm_autotune.h).
  // The grouped GEMMs take the heuristic's choice: their group sizes change
  // every step, and timing each new size would cost more than it saves. A
  // plan made untimed is cached as it is for later calls of that shape.
  bool autotune = true;
};

inline bool epilogue_has_bias(fp8kit_epilogue e) {
  return e == FP8KIT_EPILOGUE_BIAS || e == FP8KIT_EPILOGUE_GELU_BIAS;
}
inline bool epilogue_has_gelu(fp8kit_epilogue e) {
  return e == FP8KIT_EPILOGUE_GELU || e == FP8KIT_EPILOGUE_GELU_BIAS;
}

// Validates the call (throws fp8kit::Error naming the argument and the fix)
// and picks, for each operand, the copy of its data the device can read:
// where fp8kit_supports_non_tn_fp8_gemm says the device is TN-only (Hopper,
// Ada, and the CPU reference), an operand whose rowwise data is not
// K-contiguous is read from its columnwise data. Block-scaled operands are
// always read K-contiguous, each copy with its own block scales, and only
// where fp8kit_supports_block_scaled_fp8_gemm says so (gemm_block_rules.h).
GemmProblem make_gemm_problem(const fp8kit_tensor* a, const fp8kit_tensor* b,
                              const fp8kit_tensor* d, const fp8kit_gemm_config* config);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_GEMM_PROBLEM_H_
