// CPU reference amax: max |x| with NaN propagation, shared by amax,
// quantize and current scaling.
#ifndef FP8KIT_SRC_AMAX_CPU_H_
#define FP8KIT_SRC_AMAX_CPU_H_

#include "fp8kit/tensor.h"

namespace fp8kit {

// Reads element i of a float32/bfloat16/float16 buffer as float.
float load_high_precision(const void* data, fp8kit_dtype dtype, int64_t i);

// max |x| over input (float32/bfloat16/float16); NaN if any element is NaN.
float amax_cpu(const fp8kit_tensor& input);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_AMAX_CPU_H_
