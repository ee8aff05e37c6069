// The CUDA side of fp8kit/memory.h: the runtime's asynchronous copy and
// fill on the caller's stream, with the stream's device current.
#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "cuda_check.h"

namespace fp8kit {
namespace cuda {

void copy_bytes(int device_index, void* dst, const void* src, size_t bytes, void* stream) {
  ScopedDevice device(device_index, "copy_bytes");
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(stream)),
             "copy_bytes", "cudaMemcpyAsync");
}

void zero_bytes(int device_index, void* dst, size_t bytes, void* stream) {
  ScopedDevice device(device_index, "zero_bytes");
  cuda_check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)), "zero_bytes",
             "cudaMemsetAsync");
}

void copy_to_host(int device_index, void* dst, const void* src, size_t bytes, void* stream) {
  ScopedDevice device(device_index, "copy_to_host");
  const auto s = static_cast<cudaStream_t>(stream);
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy_to_host",
             "cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(s), "copy_to_host", "cudaStreamSynchronize");
}

}  // namespace cuda
}  // namespace fp8kit
