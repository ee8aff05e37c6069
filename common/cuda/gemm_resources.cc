#include "gemm_resources.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "gemm_check.h"

namespace fp8kit {
namespace cuda {
namespace {

// Handles of exited threads, by device. Never destroyed (process lifetime),
// so thread_local destructors that run late can still return handles.
struct HandlePool {
  std::mutex mu;
  std::vector<std::pair<int, cublasLtHandle_t>> free;
};
HandlePool& handle_pool() {
  static HandlePool* pool = new HandlePool;
  return *pool;
}

struct ThreadHandles {
  std::vector<cublasLtHandle_t> by_device;  // indexed by ordinal, nullptr = none yet
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (by_device[d] != nullptr) pool.free.emplace_back(int(d), by_device[d]);
    }
  }
};
thread_local ThreadHandles thread_handles;

cublasLtHandle_t acquire_handle(int device) {
  {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (size_t i = 0; i < pool.free.size(); ++i) {
      if (pool.free[i].first == device) {
        cublasLtHandle_t h = pool.free[i].second;
        pool.free.erase(pool.free.begin() + std::ptrdiff_t(i));
        return h;
      }
    }
  }
  cublasLtHandle_t h = nullptr;
  cublas_check(cublasLtCreate(&h), "cublasLtCreate");
  return h;
}

// Default workspaces by (device, stream).
struct WorkspaceMap {
  std::mutex mu;
  std::map<std::pair<int, uintptr_t>, void*> by_stream;
};
WorkspaceMap& workspace_map() {
  static WorkspaceMap* map = new WorkspaceMap;
  return *map;
}

// The last workspace this thread used: the common case (one stream per
// thread) then needs no lock.
struct LastWorkspace {
  int device = -1;
  cudaStream_t stream = nullptr;
  void* ptr = nullptr;
};
thread_local LastWorkspace last_workspace;

}  // namespace

cublasLtHandle_t thread_handle(int device) {
  std::vector<cublasLtHandle_t>& v = thread_handles.by_device;
  if (size_t(device) >= v.size()) v.resize(size_t(device) + 1, nullptr);
  if (v[size_t(device)] == nullptr) v[size_t(device)] = acquire_handle(device);
  return v[size_t(device)];
}

void* default_workspace(int device, cudaStream_t stream) {
  LastWorkspace& last = last_workspace;
  if (last.ptr != nullptr && last.device == device && last.stream == stream) return last.ptr;
  WorkspaceMap& map = workspace_map();
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(map.mu);
    const auto key = std::make_pair(device, reinterpret_cast<uintptr_t>(stream));
    auto it = map.by_stream.find(key);
    if (it != map.by_stream.end()) {
      ptr = it->second;
    } else {
      const cudaError_t e = cudaMalloc(&ptr, kGemmWorkspaceBytes);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fail(FP8KIT_CUDA_ERROR, "gemm: could not allocate fp8kit's ", kGemmWorkspaceBytes >> 20,
             " MiB cuBLASLt workspace on CUDA device ", device, " (", cudaGetErrorString(e),
             "); free memory or pass config.workspace");
      }
      map.by_stream.emplace(key, ptr);
    }
  }
  last.device = device;
  last.stream = stream;
  last.ptr = ptr;
  return ptr;
}

DeviceGuard::DeviceGuard(int device) {
  // Devices whose primary context this thread has made current (cudaSetDevice
  // does that, and keeps it current for the thread).
  thread_local std::vector<bool> context_current;
  gemm_cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
  const size_t d = static_cast<size_t>(device);
  if (d >= context_current.size()) context_current.resize(d + 1, false);
  if (previous_ != device || !context_current[d]) {
    gemm_cuda_check(cudaSetDevice(device), "cudaSetDevice");
    context_current[d] = true;
    changed_ = previous_ != device;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

}  // namespace cuda
}  // namespace fp8kit
