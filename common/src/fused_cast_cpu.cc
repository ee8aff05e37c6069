#include "fused_cast_cpu.h"

#include "column_sums_cpu.h"
#include "quantize_cpu.h"

namespace fp8kit {

void fused_cast_cpu(const float* v, int64_t rows, int64_t cols, fp8kit_tensor& out,
                    const fp8kit_fused_cast& cast, const fp8kit_column_sums* sums) {
  const int64_t shape[2] = {rows, cols};
  const fp8kit_tensor values = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape,
                                                  const_cast<float*>(v));
  if (cast.recipe == FP8KIT_FUSED_CAST_DELAYED) {
    quantize_delayed_update_cpu(&values, &out, &cast.state, sums, 1, cast.delayed_config,
                                cast.record != 0);
  } else {
    quantize_current_scaling_cpu(values, out, cast.current_config);
    if (sums != nullptr) column_sums_cpu(values, *sums);
  }
}

}  // namespace fp8kit
