// What a block-scaled fp8kit_gemm may be, on top of the rules every FP8 GEMM
// follows (gemm_problem.cc): the combinations cuBLASLt's Hopper kernels for
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F accept, checked
// up front on the CPU too so that what the CPU reference runs the GPU runs.
#ifndef FP8KIT_SRC_GEMM_BLOCK_RULES_H_
#define FP8KIT_SRC_GEMM_BLOCK_RULES_H_

#include <cstdint>

#include "fp8kit/gemm.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// True when A and B are block-scaled; throws when only one of them is.
bool gemm_is_block_scaled(const fp8kit_tensor& a, const fp8kit_tensor& b);

// The rules of a block-scaled GEMM (A and B block-scaled, op(A) M x K,
// op(B) K x N): not both 128x128; a device where
// fp8kit_supports_block_scaled_fp8_gemm holds; D bfloat16 or float32; no
// GELU epilogue; split accumulation; N a multiple of 8, and M too when A is
// 1x128.
void check_block_scaled_gemm(const fp8kit_tensor& a, const fp8kit_tensor& b,
                             const fp8kit_tensor& d, const fp8kit_gemm_config& config, int64_t m,
                             int64_t n);

// The block scales of `t`'s rowwise or columnwise copy: non-NULL and 16-byte
// aligned, or an error naming the operand (`name`) and the field.
const float* block_scales_of(const char* name, const fp8kit_tensor& t, bool from_columnwise);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_GEMM_BLOCK_RULES_H_
