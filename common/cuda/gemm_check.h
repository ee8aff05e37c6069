// Error checks of the cuBLASLt GEMM: a failed cuBLASLt or CUDA runtime call
// becomes an fp8kit::Error (FP8KIT_CUBLAS_ERROR / FP8KIT_CUDA_ERROR) whose
// message names the call and the library's own description.
#ifndef FP8KIT_CUDA_GEMM_CHECK_H_
#define FP8KIT_CUDA_GEMM_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "error.h"

namespace fp8kit {
namespace cuda {

inline void cublas_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail(FP8KIT_CUBLAS_ERROR, "gemm: ", call, " failed with ", cublasLtGetStatusName(status), ": ",
         cublasLtGetStatusString(status));
  }
}

inline void gemm_cuda_check(cudaError_t error, const char* call) {
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed
    fail(FP8KIT_CUDA_ERROR, "gemm: ", call, " failed: ", cudaGetErrorString(error));
  }
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GEMM_CHECK_H_
