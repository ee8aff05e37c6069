/* The FP8 Linear layer protocol, written once for both front ends.
 *
 * fp8kit.torch.Linear (weight [N, K]) and fp8kit.jax.dense (kernel [K, N])
 * are glue over these rules; the same inputs through either give the same
 * bits on the CPU.
 *
 *   forward   y[M,N]  = Q(x)[M,K] @ Q(w)^T            (+ bias)
 *   dgrad     dx[M,K] = Q(dy)[M,N] @ Q(w)
 *   wgrad     dw[N,K] = Q(dy)^T @ Q(x)                 (reduces over the M tokens)
 *   bias grad db[N]   = column sums of dy              (fp8kit_column_sums order)
 *
 * Slots. A layer quantizes three tensors, each with its own scaling state
 * (fp8kit_delayed_quantize_state, indexed by fp8kit_linear_slot): the input
 * x and the weight w in the recipe's forward format (E4M3), the output
 * gradient dy in its backward format (E5M2 under the hybrid format).
 *
 * Copies. FP8 GEMMs on TN-only devices (the CPU reference, Ada, Hopper:
 * fp8kit_supports_non_tn_fp8_gemm) read both operands contiguous along the
 * inner dimension, so each slot's quantization writes in one pass exactly
 * the copies (rowwise data, columnwise data) its GEMMs read, and a forward
 * keeps for backward only the copies backward reads: fp8kit_linear_plan.
 *
 * Delayed scaling, per slot (fp8kit_quantize_delayed_update does all of it
 * in one call per pass: x and w together in forward, dy in backward):
 *   - seeding: a fresh state is unseeded. The first quantization of an
 *     unseeded slot takes its scale from the tensor itself (the scale the
 *     update below would compute from this tensor's amax alone), so step 0
 *     is not cast with scale 1; recording it marks the slot seeded.
 *   - recording: a quantization in a pass that computes gradients rolls the
 *     tensor's amax into the slot's history as it is cast (x and w in the
 *     forward, dy in the backward) and recomputes the slot's scale for the
 *     next step (fp8kit_delayed_scaling_update's rule). A forward that
 *     computes no gradient (inference, or a call not differentiated) casts
 *     with the slot's scale (or, unseeded, the tensor's own) and records
 *     nothing.
 * Current scaling: each tensor's scale comes from its own amax; no state.
 *
 * Token counts. K (in_features) and N (out_features) must be positive
 * multiples of FP8KIT_GEMM_DIM_MULTIPLE (cuBLASLt's FP8 alignment, enforced
 * on the CPU too). The token count M may be any value >= 0: the wgrad GEMM,
 * whose inner dimension is M, reads the columnwise copies of x and dy
 * zero-padded to the next multiple of 16 (zeros add nothing to the sum).
 * M = 0 gives an empty y and zero gradients.
 *
 * Block scaling (fp8kit/block_scaling.h): x and dy are quantized in 1x128
 * tiles, w in 128x128 blocks, each with the scale of its own amax (no
 * state, no slots to record), the copies those of a TN device's plan
 * (block-scaled GEMMs are TN only), every GEMM with FP32-promoted
 * accumulation. The forward and dgrad GEMMs write M rows and need M a
 * multiple of 8; wgrad's inner dimension is M. So a layer pads x (and dy)
 * with zero token rows to the next multiple of FP8KIT_GEMM_DIM_MULTIPLE,
 * one count for all three GEMMs, and drops the padded rows of y and dx:
 * a zero row is a 1x128 tile of its own in the rowwise copies and adds
 * nothing to a columnwise tile's amax, so every real scale, and the
 * result, equals the unpadded one. The block cast computes no column sums:
 * the bias gradient is the front end's own float32 sum of dy (equal to the
 * column sums above up to the summation order). */
#ifndef FP8KIT_LINEAR_H_
#define FP8KIT_LINEAR_H_

#include <stdint.h>

#include "fp8kit/export.h"
#include "fp8kit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLASLt's FP8 alignment: K and N of a Linear, and every GEMM's inner
 * dimension, are multiples of this. */
#define FP8KIT_GEMM_DIM_MULTIPLE 16

/* The quantized tensors of a Linear, in the order of its scaling state. */
typedef enum fp8kit_linear_slot {
  FP8KIT_SLOT_INPUT = 0,       /* x: forward format */
  FP8KIT_SLOT_WEIGHT = 1,      /* w: forward format */
  FP8KIT_SLOT_GRAD_OUTPUT = 2, /* dy: backward format */
  FP8KIT_NUM_SLOTS = 3
} fp8kit_linear_slot;

/* How the front end stores the weight. */
typedef enum fp8kit_weight_layout {
  FP8KIT_WEIGHT_OUT_IN = 0, /* [N, K] (torch.nn.Linear's weight) */
  FP8KIT_WEIGHT_IN_OUT = 1  /* [K, N] (a JAX/Flax dense kernel) */
} fp8kit_weight_layout;

/* Which copies of one tensor are written (or kept): nonzero = yes. */
typedef struct fp8kit_copies {
  int rowwise;
  int columnwise;
} fp8kit_copies;

/* What one Linear call quantizes and keeps, in the storage layout of each
 * tensor (x [M, K], w per fp8kit_weight_layout, dy [M, N]). */
typedef struct fp8kit_linear_plan {
  fp8kit_copies quantize[FP8KIT_NUM_SLOTS]; /* copies each slot's cast writes
                                             * (dy's: in backward) */
  fp8kit_copies saved_input;                /* copies of Q(x) kept for backward */
  fp8kit_copies saved_weight;               /* copies of Q(w) kept for backward */
  int wgrad_columnwise;  /* wgrad reads the columnwise copies of x and dy */
  int64_t wgrad_inner;   /* the wgrad GEMM's inner dimension: M, rounded up
                          * to FP8KIT_GEMM_DIM_MULTIPLE when wgrad_columnwise */
} fp8kit_linear_plan;

/* The plan for a call with `tokens` (M) rows, in_features (K),
 * out_features (N), which gradients backward computes (dgrad: dx, wgrad:
 * dw) and whether the device runs non-TN FP8 GEMMs. Fails with
 * FP8KIT_ERROR_INVALID_ARGUMENT (and a message naming in_features or
 * out_features) when K or N is not a positive multiple of
 * FP8KIT_GEMM_DIM_MULTIPLE, or tokens < 0. */
FP8KIT_API fp8kit_status fp8kit_linear_plan_make(int64_t tokens, int64_t in_features,
                                                 int64_t out_features,
                                                 fp8kit_weight_layout weight_layout, int dgrad,
                                                 int wgrad, int non_tn,
                                                 fp8kit_linear_plan* plan);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_LINEAR_H_ */
