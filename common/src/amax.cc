// fp8kit_amax: validation, then the CPU reference or the CUDA kernel.
#include "fp8kit/amax.h"

#include <cmath>
#include <cstdint>

#include "amax_cpu.h"
#include "error.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" fp8kit_status fp8kit_amax(const fp8kit_tensor* input, float* amax_out, void* stream) {
  return fp8kit::guard([&] {
    using namespace fp8kit;
    check_tensor("amax", "input", input);
    check_high_precision("amax", "input", *input);
    check_element_aligned("amax", "input", *input);
    check_not_null("amax", "amax_out", amax_out);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      *amax_out = amax_cpu(*input);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::amax(*input, amax_out, stream);
#endif
    }
    (void)stream;
  });
}
