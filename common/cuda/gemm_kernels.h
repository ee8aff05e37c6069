// The GEMM's own small kernels (everything else is cuBLASLt).
#ifndef FP8KIT_CUDA_GEMM_KERNELS_H_
#define FP8KIT_CUDA_GEMM_KERNELS_H_

#include <cuda_runtime.h>

namespace fp8kit {
namespace cuda {

// *scale_inv = 1 / *scale on `stream` (an FP8 D's dequantization factor,
// which cuBLASLt does not write). IEEE division, as on the CPU.
void launch_gemm_scale_inv(const float* scale, float* scale_inv, cudaStream_t stream);

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GEMM_KERNELS_H_
