// fp8kit_copy_bytes / fp8kit_zero_bytes: checks, then memcpy/memset on the
// CPU or the CUDA runtime's asynchronous copy and fill.
#include "fp8kit/memory.h"

#include <cstring>

#include "error.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" {

fp8kit_status fp8kit_copy_bytes(fp8kit_device_type device_type, int device_index, void* dst,
                                const void* src, size_t bytes, void* stream) {
  return fp8kit::guard([&] {
    const char* op = "copy_bytes";
    fp8kit::check_device_usable(op, device_type, device_index);
    if (bytes == 0) return;
    fp8kit::check_not_null(op, "dst", dst);
    fp8kit::check_not_null(op, "src", src);
    if (device_type == FP8KIT_DEVICE_CPU) {
      std::memcpy(dst, src, bytes);
      return;
    }
#ifdef FP8KIT_WITH_CUDA
    fp8kit::cuda::copy_bytes(device_index, dst, src, bytes, stream);
#endif
    (void)stream;
  });
}

fp8kit_status fp8kit_zero_bytes(fp8kit_device_type device_type, int device_index, void* dst,
                                size_t bytes, void* stream) {
  return fp8kit::guard([&] {
    const char* op = "zero_bytes";
    fp8kit::check_device_usable(op, device_type, device_index);
    if (bytes == 0) return;
    fp8kit::check_not_null(op, "dst", dst);
    if (device_type == FP8KIT_DEVICE_CPU) {
      std::memset(dst, 0, bytes);
      return;
    }
#ifdef FP8KIT_WITH_CUDA
    fp8kit::cuda::zero_bytes(device_index, dst, bytes, stream);
#endif
    (void)stream;
  });
}

}  // extern "C"
