/* The FP8 cast a fused kernel applies to the float32 tensor it computes.
 *
 * Fused ops (fp8kit/normalization.h, fp8kit/activation.h) compute a float32
 * tensor v (a normalized row, an activation, a gradient) and write its FP8
 * copies for the next GEMM directly, so no separate read and write pass is
 * spent on the cast. The cast reads v as the float32 value the op computed,
 * not v rounded to the op's input dtype first.
 *
 * Semantics, bit for bit: the fused op leaves its FP8 output descriptor
 * (`out`: data, columnwise_data, scale_inv, and for current scaling scale
 * and amax), the scaling state and the column sums exactly as
 *   FP8KIT_FUSED_CAST_DELAYED:
 *     fp8kit_quantize_delayed_update(&v, out, &cast->state, sums, 1,
 *                                    &cast->delayed_config, cast->record)
 *     (fresh-slot seeding from v's own amax, the amax recorded into the
 *     history and the scale recomputed when record != 0, the accumulator
 *     and counter reset; `out` follows that function's rules for
 *     outputs[i]: scale and amax NULL, scale_inv optional);
 *   FP8KIT_FUSED_CAST_CURRENT:
 *     fp8kit_quantize_current_scaling(&v, out, &cast->current_config, sums)
 *     (scale from v's own amax; out->scale, scale_inv and amax required
 *     and written);
 * leave them, where v is a float32 tensor holding the values the op
 * computed. `out` has v's shape and is E4M3 or E5M2 with scaling mode
 * PER_TENSOR; its rowwise `data` and/or `columnwise_data` (transposed,
 * fp8kit/tensor.h) are written in one pass. Column sums, where an op takes
 * them, are those of v (fp8kit/column_sums.h) and need columnwise_data.
 *
 * Passes: delayed scaling with a seeded slot (seeded NULL or 1) casts in
 * the op's single pass. A fresh slot (seeded == 0) and current scaling need
 * v's amax before the cast: the op runs an amax pass first (on CUDA a
 * second launch that recomputes v and stores nothing; for a seeded slot
 * that launch exits at once). */
#ifndef FP8KIT_FUSED_CAST_H_
#define FP8KIT_FUSED_CAST_H_

#include "fp8kit/delayed_scaling.h"
#include "fp8kit/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fp8kit_fused_cast_recipe {
  FP8KIT_FUSED_CAST_DELAYED = 0, /* state + delayed_config + record */
  FP8KIT_FUSED_CAST_CURRENT = 1  /* current_config */
} fp8kit_fused_cast_recipe;

typedef struct fp8kit_fused_cast {
  fp8kit_fused_cast_recipe recipe;
  /* Delayed scaling: one slot's state (every pointer on the op's device),
   * its recipe, and whether this pass records (a pass that computes
   * gradients). */
  fp8kit_delayed_quantize_state state;
  fp8kit_delayed_scaling_config delayed_config;
  int record;
  /* Current scaling. */
  fp8kit_current_scaling_config current_config;
} fp8kit_fused_cast;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_FUSED_CAST_H_ */
