/* amax: max |x| over a whole tensor. */
#ifndef FP8KIT_AMAX_H_
#define FP8KIT_AMAX_H_

#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes max |x| of `input` (float32, bfloat16 or float16) as one float32 to
 * `amax_out`, which lives on the input's device. A NaN anywhere gives NaN;
 * +-inf gives inf; an empty tensor gives 0. `stream` is a cudaStream_t for
 * CUDA inputs (NULL = default stream) and ignored on CPU. */
FP8KIT_API fp8kit_status fp8kit_amax(const fp8kit_tensor* input, float* amax_out, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_AMAX_H_ */
