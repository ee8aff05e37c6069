// Small host-side helpers for sizing kernel launches.
#ifndef FP8KIT_CUDA_LAUNCH_CONFIG_H_
#define FP8KIT_CUDA_LAUNCH_CONFIG_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"

namespace fp8kit {
namespace cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool is_aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Number of SMs of the current device (the runtime answers from its cache).
inline int sm_count(const char* op) {
  int device = 0, count = 0;
  cuda_check(cudaGetDevice(&device), op, "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), op,
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  return count > 0 ? count : 1;
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_LAUNCH_CONFIG_H_
