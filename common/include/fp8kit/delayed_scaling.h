/* Delayed scaling: amax-history update and scale recomputation for many
 * tensors in one call (one kernel launch per 64 tensors on CUDA). */
#ifndef FP8KIT_DELAYED_SCALING_H_
#define FP8KIT_DELAYED_SCALING_H_

#include "fp8kit/column_sums.h"
#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The valid ranges of a delayed-scaling recipe, one rule for the core and
 * both front ends (fp8kit.recipe states the same numbers; the extensions
 * export these):
 *   margin      an integer in [0, FP8KIT_MARGIN_MAX], so that 2**-margin
 *               is a normal float32 (and built exactly);
 *   amax_history_len an integer in [1, FP8KIT_AMAX_HISTORY_LEN_MAX] (1 keeps
 *               only the newest amax); the bound, 2**20, is far beyond any
 *               useful history and keeps a layer's history buffers (a few
 *               MiB) and their indexing well within int.
 * fp8kit_delayed_scaling_update and fp8kit_quantize_delayed_update fail
 * with FP8KIT_INVALID_ARGUMENT, naming the field, outside them. */
#define FP8KIT_MARGIN_MAX 126
#define FP8KIT_AMAX_HISTORY_LEN_MAX 1048576

typedef enum fp8kit_amax_reduction {
  FP8KIT_AMAX_MAX = 0,        /* max over the whole history */
  FP8KIT_AMAX_MOST_RECENT = 1 /* the newest amax only */
} fp8kit_amax_reduction;

/* One tensor's scaling state; every pointer is on the call's device. */
typedef struct fp8kit_delayed_scaling_state {
  float* amax_history;  /* [amax_history_len], element 0 is the newest */
  const float* amax;    /* the amax the last quantize wrote (1 float) */
  float* scale;         /* read (previous scale) and written */
  float* scale_inv;     /* written (= 1/scale) */
  fp8kit_dtype fp8_dtype; /* E4M3 or E5M2: gives fp8_max */
} fp8kit_delayed_scaling_state;

typedef struct fp8kit_delayed_scaling_config {
  int amax_history_len;                 /* [1, FP8KIT_AMAX_HISTORY_LEN_MAX] */
  int margin;                      /* [0, FP8KIT_MARGIN_MAX]:
                                    * scale = fp8_max / amax_reduced / 2**margin */
  fp8kit_amax_reduction amax_reduction;
} fp8kit_delayed_scaling_config;

/* For each state, in order:
 *   1. roll the history: h[i] = h[i-1] for i = len-1..1, h[0] = *amax;
 *   2. amax_reduced = max(h) or h[0] per config->amax_reduction (NaN-propagating);
 *   3. if amax_reduced is finite and > 0:
 *        scale = fp8_max / amax_reduced / 2**margin, else keep the previous scale;
 *   4. scale_inv = 1 / scale.
 * In float32: (fp8_max / amax_reduced) * 2**-margin; a scale that overflows
 * is clamped to FLT_MAX and one that underflows to FLT_MIN, so scale_inv
 * stays finite; and a scale below fp8_max / FLT_MAX (an amax within
 * 2**margin of FLT_MAX) is raised to it, so that no FP8 value dequantizes
 * to inf (the margin then gives less headroom than asked). `amax` may point into the history (it is
 * read before the roll); different states must not share buffers (the
 * CUDA update runs them in parallel).
 * `states` is a host array of `count` entries. */
FP8KIT_API fp8kit_status fp8kit_delayed_scaling_update(
    const fp8kit_delayed_scaling_state* states, int count,
    const fp8kit_delayed_scaling_config* config, fp8kit_device_type device_type,
    int device_index, void* stream);

/* One tensor's state for fp8kit_quantize_delayed_update; every pointer is
 * on the call's device and none aliases another. */
typedef struct fp8kit_delayed_quantize_state {
  float* amax_history;  /* [amax_history_len], element 0 is the newest */
  float* amax;          /* amax accumulator: >= 0 (or NaN) on entry, 0 on exit */
  float* scale;         /* read (this quantization's scale unless the slot is fresh)
                         * and, when recording, written (the next one) */
  float* scale_inv;     /* written when recording (= 1/the new scale) */
  unsigned int* counter; /* 0 on entry and on exit: the CUDA kernel counts its
                          * finished blocks here to find the last one */
  float* seeded;        /* 0: unseeded, 1: seeded (see below); NULL: the caller
                         * knows the slot is seeded, and no check is made. A
                         * float, so that a framework whose state must be a
                         * differentiable pytree (JAX) holds it as it is. */
} fp8kit_delayed_quantize_state;

/* Delayed-scaling quantization with the scaling-state update fused in, for
 * `count` tensors at once (on CUDA one kernel launch per kind of cast, no
 * separate amax-zeroing or update launches; one more, short, launch when
 * any state has a `seeded` flag). For each i, with
 *   amax  = max(*states[i].amax, max |inputs[i]|)  (NaN-propagating: the
 *           accumulator's entry value folded in),
 *   fresh = states[i].seeded != NULL && *states[i].seeded == 0:
 *   1. the scale used: *states[i].scale, or for a fresh slot the seed
 *      scale, the one the update of fp8kit_delayed_scaling_update would
 *      compute from `amax` alone: fp8_max / amax / 2**margin with the same
 *      clamps, or *states[i].scale when amax is zero, NaN or inf;
 *   2. outputs[i] = quantize(inputs[i]) with the scale used, exactly as
 *      fp8kit_quantize, whose scale policy (fp8kit/quantize.h) applies: a
 *      scale used that is not finite and > 0 becomes NaN, every element
 *      the FP8 NaN code; outputs[i].scale_inv (optional) receives 1/the
 *      scale used (NaN then). outputs[i].scale and outputs[i].amax must
 *      be NULL (the state holds them);
 *   3. sums (optional: NULL or `count` entries; entry i, when its `sums`
 *      field is non-NULL) receives the column sums of inputs[i]
 *      (fp8kit/column_sums.h);
 *   4. record != 0 (a pass that computes gradients): the update of
 *      fp8kit_delayed_scaling_update with `amax` as the newest amax and the
 *      scale used as the previous scale: roll it into the history, reduce,
 *      write the new scale and scale_inv (a NaN scale used stays in the
 *      state when the amax gives no new scale); then *seeded = 1 (when
 *      non-NULL).
 *      record == 0 (a pass that computes no gradient): history, scale,
 *      scale_inv and seeded are left as they are;
 *   5. *states[i].amax = 0 and *states[i].counter = 0 (in both modes).
 * So a quantization at step t uses the scale from the history up to step
 * t-1, as with fp8kit_quantize + fp8kit_delayed_scaling_update, except that
 * a fresh slot's first step uses its own amax; the saved
 * outputs[i].scale_inv stays valid after the state moves on. All tensors
 * are on one device; states must not be shared within a call, and calls
 * sharing a state must not run concurrently. count <= 64. */
FP8KIT_API fp8kit_status fp8kit_quantize_delayed_update(
    const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
    const fp8kit_delayed_quantize_state* states, const fp8kit_column_sums* sums, int count,
    const fp8kit_delayed_scaling_config* config, int record, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_DELAYED_SCALING_H_ */
