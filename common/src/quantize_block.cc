// fp8kit_quantize_block_scaling and fp8kit_block_scale_inv_shape: shared
// validation, then the CPU reference or the CUDA kernel.
#include "fp8kit/block_scaling.h"

#include "block_scale_layout.h"
#include "error.h"
#include "quantize_block_cpu.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" fp8kit_status fp8kit_block_scale_inv_shape(const fp8kit_tensor* t, int columnwise,
                                                      int64_t shape[2]) {
  return fp8kit::guard([&] {
    const char* op = "block_scale_inv_shape";
    fp8kit::check_tensor(op, "t", t, /*allow_null_data=*/true);
    fp8kit::check_not_null(op, "shape", shape);
    fp8kit::check_block_mode(op, "t", *t);
    int64_t rows = 0, cols = 0;
    fp8kit::flatten_2d(*t, &rows, &cols);
    // The columnwise copy is stored [cols, rows].
    const fp8kit::BlockScaleLayout l =
        fp8kit::BlockScaleLayout::of(t->scaling_mode, columnwise ? cols : rows,
                                     columnwise ? rows : cols);
    shape[0] = l.outer;
    shape[1] = l.inner;
  });
}

extern "C" fp8kit_status fp8kit_quantize_block_scaling(const fp8kit_tensor* input,
                                                       fp8kit_tensor* output,
                                                       const fp8kit_current_scaling_config* config,
                                                       void* stream) {
  return fp8kit::guard([&] {
    const char* op = "quantize_block_scaling";
    fp8kit::check_block_quantize_args(op, input, output);
    fp8kit::check_current_scaling_config(op, config);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_block_scaling_cpu(*input, *output, *config);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize_block_scaling(*input, *output, *config, stream);
#endif
    }
    (void)stream;
  });
}
