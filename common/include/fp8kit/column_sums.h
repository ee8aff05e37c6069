/* Column sums computed by a quantization pass (the bias gradient of a
 * Linear), one order on every device. */
#ifndef FP8KIT_COLUMN_SUMS_H_
#define FP8KIT_COLUMN_SUMS_H_

#include <stdint.h>

#include "fp8kit/export.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Column sums of an input, computed by its quantization pass
 * (fp8kit_quantize_delayed_update, fp8kit_quantize_current_scaling): a
 * Linear's bias gradient is the column sums of the output gradient, so it
 * costs no read of its own. For an input whose 2-D view is [rows, cols]:
 *   sums[c] = the sum over rows r of input[r, c], in float32 in this order
 *   (which the CPU and CUDA implementations share, so they agree bit for
 *   bit): rows are cut into tiles of 128 and tiles into groups of 8; a group
 *   sum adds its 8 rows in order to 0.0f (rows past the end add 0.0f), a
 *   tile sum adds its 16 group sums in order to 0.0f, and sums[c] adds the
 *   tile sums in order to 0.0f; then it is rounded to `dtype` (RNE; a NaN
 *   becomes the dtype's canonical quiet NaN).
 * The quantization computing them must be the cast+transpose pass: its
 * output has a columnwise copy and the input's 2-D view has rows > 1 and
 * cols > 1. */
typedef struct fp8kit_column_sums {
  void* sums;              /* [cols] in `dtype` */
  fp8kit_dtype dtype;      /* float32, bfloat16 or float16 */
  float* partials;         /* workspace: fp8kit_column_sums_workspace(rows, cols) floats */
  unsigned int* counters;  /* [ceil(cols / 128)]: 0 on entry and on exit (the CUDA
                            * kernel counts finished row tiles here) */
} fp8kit_column_sums;

/* Floats of workspace fp8kit_column_sums needs for a [rows, cols] input:
 * ceil(rows / 128) * cols (0 for a negative or empty shape). */
FP8KIT_API int64_t fp8kit_column_sums_workspace(int64_t rows, int64_t cols);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_COLUMN_SUMS_H_ */
