// CUDA runtime error checks for the quantization kernels: a failed call or
// launch becomes fp8kit::Error(FP8KIT_CUDA_ERROR) whose message names the
// op, the call and CUDA's own description, e.g.
//   "quantize: launching the cast+transpose kernel failed: invalid argument".
#ifndef FP8KIT_CUDA_CUDA_CHECK_H_
#define FP8KIT_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "error.h"

namespace fp8kit {
namespace cuda {

inline void cuda_check(cudaError_t error, const char* op, const char* what) {
  if (error != cudaSuccess) {
    // Clear a non-sticky error so that the next fp8kit call is not blamed.
    (void)cudaGetLastError();
    fail(FP8KIT_CUDA_ERROR, op, ": ", what, " failed: ", cudaGetErrorString(error), " (",
         cudaGetErrorName(error), ")");
  }
}

// After a <<<...>>> launch: reports a bad configuration or a sticky error
// from earlier work on the device.
inline void check_launch(const char* op, const char* kernel) {
  cuda_check(cudaGetLastError(), op, kernel);
}

// Makes `device` current for the lifetime of the object (a no-op when it
// already is) and restores the previous device afterwards, so a tensor on
// cuda:1 launches on cuda:1 whatever the caller's current device.
class ScopedDevice {
 public:
  ScopedDevice(int device, const char* op) {
    cuda_check(cudaGetDevice(&previous_), op, "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), op, "cudaSetDevice");
  }
  ~ScopedDevice() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) {
      (void)cudaSetDevice(previous_);
    }
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_CUDA_CHECK_H_
