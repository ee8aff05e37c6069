// CUDA device queries behind fp8kit/device.h: the device count, compute
// capabilities and the "non-TN FP8 GEMM" and "block-scaled FP8 GEMM"
// capabilities, each computed once per device (std::call_once per ordinal)
// so the GEMM may ask on every call.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "cuda_backend.h"
#include "error.h"

namespace fp8kit {
namespace cuda {
namespace {

// cuBLASLt's FP8 layout rule (see fp8kit/device.h): Ada (8.9), Hopper (9.0)
// and the GeForce/workstation Blackwell parts (12.x) run FP8 GEMMs only in
// the TN layout; data-center Blackwell (10.x), 11.x and 13.0+ run all four.
bool non_tn_fp8_gemm_rule(int capability) {
  return (capability >= 100 && capability < 120) || capability >= 130;
}

// The cuBLASLt release that added the Hopper block-scaled FP8 GEMMs
// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F and BLK128x128_32F), in
// CUBLAS_VERSION's encoding.
constexpr int kBlockScaledCublasLtVersion = 120900;

std::string cublaslt_version_string(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// Empty when the device runs block-scaled FP8 GEMMs, else what it lacks.
std::string block_scaled_rule(int device_index, int capability) {
  std::string missing;
  if (capability != 90) {
    missing = "CUDA device " + std::to_string(device_index) + " has compute capability " +
              std::to_string(capability / 10) + "." + std::to_string(capability % 10);
  }
  if (CUBLAS_VERSION < kBlockScaledCublasLtVersion) {
    if (!missing.empty()) missing += " and ";
    missing += "fp8kit was built against cuBLASLt " + cublaslt_version_string(CUBLAS_VERSION);
  }
  const size_t runtime = cublasLtGetVersion();
  if (runtime < size_t(kBlockScaledCublasLtVersion)) {
    if (!missing.empty()) missing += " and ";
    missing += "the cuBLASLt loaded is " + cublaslt_version_string(runtime);
  }
  return missing;
}

struct DeviceInfo {
  int capability = 0;
  bool non_tn_fp8_gemm = false;
  std::string block_scaled_missing;
};

// Sized by the device count, which is fixed for the life of the process.
// Built once (a function-local static initializer is thread-safe) and never
// destroyed, so queries made while other statics are torn down stay valid.
struct DeviceTable {
  int count = 0;
  std::unique_ptr<std::once_flag[]> once;
  std::unique_ptr<DeviceInfo[]> info;
};

DeviceTable& table() {
  static DeviceTable* t = [] {
    auto* table = new DeviceTable;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: a CPU-only machine
      n = 0;
    }
    table->count = n;
    table->once.reset(new std::once_flag[n > 0 ? n : 1]);
    table->info.reset(new DeviceInfo[n > 0 ? n : 1]);
    return table;
  }();
  return *t;
}

const DeviceInfo& device_info(int device_index) {
  DeviceTable& t = table();
  FP8KIT_CHECK(device_index >= 0 && device_index < t.count, "CUDA device ", device_index,
               " does not exist (", t.count, " visible)");
  // If the body throws, the flag stays unset and the next call retries.
  std::call_once(t.once[device_index], [&] {
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index);
    if (e == cudaSuccess) {
      e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(FP8KIT_CUDA_ERROR, "could not read the compute capability of CUDA device ",
           device_index, ": ", cudaGetErrorString(e));
    }
    DeviceInfo& info = t.info[device_index];
    info.capability = major * 10 + minor;
    info.non_tn_fp8_gemm = non_tn_fp8_gemm_rule(info.capability);
    info.block_scaled_missing = block_scaled_rule(device_index, info.capability);
  });
  return t.info[device_index];
}

}  // namespace

int device_count() { return table().count; }

int compute_capability(int device_index) { return device_info(device_index).capability; }

bool supports_non_tn_fp8_gemm(int device_index) {
  return device_info(device_index).non_tn_fp8_gemm;
}

const std::string& block_scaled_fp8_gemm_missing(int device_index) {
  return device_info(device_index).block_scaled_missing;
}

}  // namespace cuda
}  // namespace fp8kit
