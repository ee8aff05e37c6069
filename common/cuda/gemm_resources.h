// Per-thread cuBLASLt handles and fp8kit's default GEMM workspaces.
#ifndef FP8KIT_CUDA_GEMM_RESOURCES_H_
#define FP8KIT_CUDA_GEMM_RESOURCES_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace fp8kit {
namespace cuda {

// Workspace fp8kit allocates when the caller passes none, and the size
// fp8kit_gemm_workspace_size() recommends: 32 MiB, what cuBLASLt's Hopper
// FP8 kernels with split-K and stream-K want at the largest shapes.
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

// The calling thread's cuBLASLt handle for `device` (the current device),
// created on first use. A handle is used by one thread at a time; when the
// thread exits its handles go to a process-wide pool for reuse by later
// threads instead of being destroyed during teardown.
cublasLtHandle_t thread_handle(int device);

// fp8kit's own workspace for (device, stream), kGemmWorkspaceBytes,
// allocated with cudaMalloc on first use and kept for the life of the
// process. One per stream, because GEMMs on different streams may run at
// the same time; work on one stream is ordered, so sharing it there is safe.
void* default_workspace(int device, cudaStream_t stream);

// Makes `device` current for the scope and restores the previous device.
// It also makes the device's primary context current in this thread, once
// per thread and device: cuBLASLt launches some kernels through the driver
// API, which needs a current context, and the runtime makes one current
// only at its own first call that needs it, so a thread whose first CUDA
// work is an fp8kit GEMM (a worker thread of a framework that allocates
// from a cache) would otherwise fail to launch.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GEMM_RESOURCES_H_
