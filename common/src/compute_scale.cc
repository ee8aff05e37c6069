// fp8kit_compute_scale: the scale step of current scaling on its own.
#include "compute_scale.h"

#include "error.h"
#include "fp8kit/quantize.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" fp8kit_status fp8kit_compute_scale(const float* amax, float* scale, float* scale_inv,
                                              fp8kit_dtype fp8_dtype,
                                              const fp8kit_current_scaling_config* config,
                                              fp8kit_device_type device_type, int device_index,
                                              void* stream) {
  return fp8kit::guard([&] {
    const char* op = "compute_scale";
    fp8kit::check_not_null(op, "amax", amax);
    fp8kit::check_not_null(op, "scale", scale);
    fp8kit::check_not_null(op, "scale_inv", scale_inv);
    FP8KIT_CHECK(fp8kit::is_fp8(fp8_dtype), op, ": fp8_dtype is ", fp8kit_dtype_name(fp8_dtype),
                 "; expected FP8KIT_E4M3 or FP8KIT_E5M2");
    fp8kit::check_current_scaling_config(op, config);
    fp8kit::check_device_usable(op, device_type, device_index);
    const float fp8_max = fp8kit_fp8_max(fp8_dtype);
    if (device_type == FP8KIT_DEVICE_CPU) {
      const float s = fp8kit::current_scale_from_amax(*amax, fp8_max, config->amax_epsilon,
                                                      config->power_2_scale != 0);
      *scale = s;
      *scale_inv = fp8kit::reciprocal(s);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::compute_scale(amax, scale, scale_inv, fp8_max, *config, device_index, stream);
#endif
    }
    (void)stream;
  });
}
