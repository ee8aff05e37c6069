// fp8kit_delayed_scaling_update: validation of the config and every state,
// then the CPU reference or the CUDA kernel (one launch per 64 states).
#include "fp8kit/delayed_scaling.h"

#include "delayed_scaling_cpu.h"
#include "error.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

void check_delayed_scaling_args(const fp8kit_delayed_scaling_state* states, int count,
                                const fp8kit_delayed_scaling_config* config,
                                fp8kit_device_type device_type, int device_index) {
  const char* op = "delayed_scaling_update";
  FP8KIT_CHECK(count >= 0, op, ": count is ", count, "; it must be >= 0");
  FP8KIT_CHECK(count == 0 || states != nullptr, op, ": states is NULL but count is ", count,
               "; pass an array of count fp8kit_delayed_scaling_state");
  check_delayed_scaling_config(op, config);
  check_device_usable(op, device_type, device_index);
  for (int i = 0; i < count; ++i) {
    const fp8kit_delayed_scaling_state& s = states[i];
    FP8KIT_CHECK(s.amax_history != nullptr, op, ": states[", i,
                 "].amax_history is NULL; pass a buffer of amax_history_len floats");
    FP8KIT_CHECK(s.amax != nullptr, op, ": states[", i,
                 "].amax is NULL; pass the 1-float amax the last quantize wrote");
    FP8KIT_CHECK(s.scale != nullptr, op, ": states[", i,
                 "].scale is NULL; pass the 1-float scale buffer (read and written)");
    FP8KIT_CHECK(s.scale_inv != nullptr, op, ": states[", i,
                 "].scale_inv is NULL; pass a 1-float buffer for 1/scale");
    FP8KIT_CHECK(is_fp8(s.fp8_dtype), op, ": states[", i, "].fp8_dtype is ",
                 fp8kit_dtype_name(s.fp8_dtype), "; use FP8KIT_E4M3 or FP8KIT_E5M2");
  }
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_delayed_scaling_update(
    const fp8kit_delayed_scaling_state* states, int count,
    const fp8kit_delayed_scaling_config* config, fp8kit_device_type device_type,
    int device_index, void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_delayed_scaling_args(states, count, config, device_type, device_index);
    if (count == 0) return;
    if (device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::delayed_scaling_update_cpu(states, count, *config);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::delayed_scaling_update(states, count, *config, device_index, stream);
#endif
    }
    (void)stream;
  });
}
