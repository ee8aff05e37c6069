#include "gemm_check.h"
#include "gemm_kernels.h"

namespace fp8kit {
namespace cuda {
namespace {

__global__ void gemm_scale_inv_kernel(const float* scale, float* scale_inv) {
  *scale_inv = 1.0f / *scale;
}

}  // namespace

void launch_gemm_scale_inv(const float* scale, float* scale_inv, cudaStream_t stream) {
  gemm_scale_inv_kernel<<<1, 1, 0, stream>>>(scale, scale_inv);
  gemm_cuda_check(cudaGetLastError(), "launching the D scale_inv kernel");
}

}  // namespace cuda
}  // namespace fp8kit
