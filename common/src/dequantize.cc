// fp8kit_dequantize: shared validation, then the CPU reference or the CUDA
// kernel.
#include "fp8kit/quantize.h"

#include "dequantize_cpu.h"
#include "error.h"
#include "quantize_validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" fp8kit_status fp8kit_dequantize(const fp8kit_tensor* input, fp8kit_tensor* output,
                                           int from_columnwise, void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_dequantize_args(input, output, from_columnwise);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::dequantize_cpu(*input, *output, from_columnwise != 0);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::dequantize(*input, *output, from_columnwise != 0, stream);
#endif
    }
    (void)stream;
  });
}
