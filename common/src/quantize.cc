// fp8kit_quantize and fp8kit_quantize_current_scaling: shared validation,
// then the CPU reference or the CUDA kernels.
#include "fp8kit/quantize.h"

#include "column_sums_cpu.h"
#include "error.h"
#include "quantize_cpu.h"
#include "quantize_validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" fp8kit_status fp8kit_quantize(const fp8kit_tensor* input, fp8kit_tensor* output,
                                         void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_quantize_args("quantize", input, output, /*current_scaling=*/false);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_delayed_cpu(*input, *output);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize(*input, *output, stream);
#endif
    }
    (void)stream;
  });
}

extern "C" fp8kit_status fp8kit_quantize_current_scaling(
    const fp8kit_tensor* input, fp8kit_tensor* output,
    const fp8kit_current_scaling_config* config, const fp8kit_column_sums* sums, void* stream) {
  return fp8kit::guard([&] {
    const char* op = "quantize_current_scaling";
    fp8kit::check_quantize_args(op, input, output, /*current_scaling=*/true);
    fp8kit::check_current_scaling_config(op, config);
    if (sums != nullptr && sums->sums == nullptr) sums = nullptr;
    if (sums != nullptr) {
      fp8kit::check_column_sums(op, "sums", "input", "output->columnwise_data", *input, *output,
                                *sums);
    }
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_current_scaling_cpu(*input, *output, *config);
      if (sums != nullptr) fp8kit::column_sums_cpu(*input, *sums);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize_current_scaling(*input, *output, *config, sums, stream);
#endif
    }
    (void)stream;
  });
}
