// Device capability queries: the CPU answers here, CUDA answers (cached per
// device) in common/cuda/device.cu.
#include "fp8kit/device.h"

#include "error.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" {

fp8kit_status fp8kit_supports_non_tn_fp8_gemm(fp8kit_device_type device_type, int device_index,
                                              int* supported) {
  return fp8kit::guard([&] {
    fp8kit::check_not_null("supports_non_tn_fp8_gemm", "supported", supported);
    fp8kit::check_device_usable("supports_non_tn_fp8_gemm", device_type, device_index);
    if (device_type == FP8KIT_DEVICE_CPU) {
      *supported = 0;  // the CPU reference follows Hopper's TN-only rule
      return;
    }
#ifdef FP8KIT_WITH_CUDA
    *supported = fp8kit::cuda::supports_non_tn_fp8_gemm(device_index) ? 1 : 0;
#endif
  });
}

fp8kit_status fp8kit_supports_block_scaled_fp8_gemm(fp8kit_device_type device_type,
                                                   int device_index, int* supported) {
  return fp8kit::guard([&] {
    const char* op = "supports_block_scaled_fp8_gemm";
    fp8kit::check_not_null(op, "supported", supported);
    fp8kit::check_device_usable(op, device_type, device_index);
    if (device_type == FP8KIT_DEVICE_CPU) {
      *supported = 1;  // the CPU reference
      return;
    }
#ifdef FP8KIT_WITH_CUDA
    *supported = fp8kit::cuda::block_scaled_fp8_gemm_missing(device_index).empty() ? 1 : 0;
#endif
  });
}

fp8kit_status fp8kit_cuda_compute_capability(int device_index, int* capability) {
  return fp8kit::guard([&] {
    fp8kit::check_not_null("cuda_compute_capability", "capability", capability);
    fp8kit::check_device_usable("cuda_compute_capability", FP8KIT_DEVICE_CUDA, device_index);
#ifdef FP8KIT_WITH_CUDA
    *capability = fp8kit::cuda::compute_capability(device_index);
#endif
  });
}

int fp8kit_cuda_device_count(void) {
#ifdef FP8KIT_WITH_CUDA
  try {
    return fp8kit::cuda::device_count();
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

}  // extern "C"
