// CPU reference of per-tensor quantization: one pass over the input that
// writes the rowwise and/or columnwise FP8 copies and measures amax.
#ifndef FP8KIT_SRC_QUANTIZE_CPU_H_
#define FP8KIT_SRC_QUANTIZE_CPU_H_

#include <cstdint>

#include "fp8kit/delayed_scaling.h"
#include "fp8kit/quantize.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// q = fp8(x * scale) for every element of `input` (float32/bfloat16/float16,
// validated). `data` (row-major, input's shape) and `columnwise` (the
// [rows, cols] flattening transposed, i.e. row-major [cols, rows]) are
// written when non-NULL. Returns max |x| (NaN if any x is NaN, 0 if empty).
float quantize_cpu(const fp8kit_tensor& input, float scale, fp8kit_dtype fp8_dtype, uint8_t* data,
                   uint8_t* columnwise);

// fp8kit_quantize on a CPU tensor (arguments validated).
void quantize_delayed_cpu(const fp8kit_tensor& input, fp8kit_tensor& output);

// fp8kit_quantize_current_scaling on a CPU tensor (arguments validated):
// amax pass, scale, cast pass.
void quantize_current_scaling_cpu(const fp8kit_tensor& input, fp8kit_tensor& output,
                                  const fp8kit_current_scaling_config& config);

// fp8kit_quantize_delayed_update on CPU tensors (arguments validated):
// for each tensor in order, seed scale, quantize, column sums (`sums`:
// NULL or `count` entries, a NULL `sums` field skipping), then the
// delayed-scaling update when `record`.
void quantize_delayed_update_cpu(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                                 const fp8kit_delayed_quantize_state* states,
                                 const fp8kit_column_sums* sums, int count,
                                 const fp8kit_delayed_scaling_config& config, bool record);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_QUANTIZE_CPU_H_
