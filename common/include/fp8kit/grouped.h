/* FP8 over groups of tokens: the expert layers of a mixture of experts.
 *
 * Contiguous layout. A token-grouped tensor x [T, F] holds the tokens of
 * E groups (experts) one group after another: group g owns rows
 * [start_g, start_g + m_g), start_g = m_0 + ... + m_{g-1}, and the group
 * sizes m_g (>= 0, zero allowed) sum to T. `group_sizes` is an FP8KIT_INT64
 * tensor [E] (1 <= E <= FP8KIT_MAX_GROUPS) on the CPU or on the op's CUDA device; an op on CUDA reads it
 * with one copy to the host and a wait on `stream` (the per-group GEMMs
 * are planned on the host), which is why group sizes that already live on
 * the host are cheaper. Sizes < 0 or a sum other than T are an
 * FP8KIT_INVALID_ARGUMENT error naming them.
 *
 * Expert-stacked tensors (the weights w [E, R, C]) hold one [R, C] matrix
 * per group; their columnwise copy is each matrix's transpose, [E, C, R]
 * (per group, not the whole tensor flattened as fp8kit/tensor.h lays out
 * a single tensor's copy).
 *
 * Per-group scales. A per-tensor FP8 copy of a grouped tensor has one
 * scale per group: the descriptor's scale, scale_inv and amax each point at
 * E * FP8KIT_GROUP_SCALE_STRIDE floats, group g's (for expert-stacked
 * weights, matrix g's) at index g * FP8KIT_GROUP_SCALE_STRIDE, the floats
 * between them unused: cuBLASLt reads a scale with a 16-byte access and
 * refuses one that is not 16-byte aligned (fp8kit/gemm.h), so each group's
 * scale gets 16 bytes of its own and no per-call copy is needed. Group g's FP8 values are exactly those
 * fp8kit_quantize (given scales) or fp8kit_quantize_current_scaling would
 * write for its rows alone, the scale policy of fp8kit/quantize.h and the
 * scale rule of current scaling included, on the CPU and CUDA alike.
 *
 * Grouped columnwise copy (what the weight-gradient GEMM reads: its inner
 * dimension is the tokens of one group). The transpose of each group's
 * rows, [F, p_g] with p_g = m_g rounded up to FP8KIT_GEMM_DIM_MULTIPLE
 * (zero columns after the m_g real ones: zeros add nothing to the sum over
 * tokens), the groups one after another: group g's block starts at element
 * F * (p_0 + ... + p_{g-1}). The buffer holds
 * F * fp8kit_grouped_columnwise_tokens(T, E) elements; those after the
 * last group's block are written as zeros too, so that the whole buffer is
 * defined. */
/* Block scaling over groups: the padded row layout. A block-scaled GEMM
 * reads its token dimension in multiples of 8 or 16 (fp8kit/gemm.h), so
 * block-scaled grouped tensors hold each group's rows padded: group g owns
 * rows [P_g, P_g + p_g), P_g = p_0 + ... + p_{g-1}, its m_g real rows
 * first and zero rows after them (the caller writes the zeros: a zero row
 * changes no tile's scale and adds nothing to a sum). Each group is then
 * quantized and multiplied as a tensor of its own [p_g, F]: its rowwise
 * copy at rows [P_g, P_g + p_g), its columnwise copy [F, p_g] at element
 * F * P_g, and each copy's block scales (the layout of
 * fp8kit/block_scaling.h for a [p_g, F] tensor) one group after another.
 * Expert-stacked weights [E, R, C] are the case m_g = R for every g (R a
 * multiple of FP8KIT_GEMM_DIM_MULTIPLE, so no row is padding). */
#ifndef FP8KIT_GROUPED_H_
#define FP8KIT_GROUPED_H_

#include <stdint.h>

#include "fp8kit/delayed_scaling.h"
#include "fp8kit/export.h"
#include "fp8kit/gemm.h"
#include "fp8kit/quantize.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Floats from one group's scale to the next (16 bytes). */
#define FP8KIT_GROUP_SCALE_STRIDE 4

/* The most groups one grouped op takes: the CUDA kernels receive every
 * group's offsets in their kernel parameter. */
#define FP8KIT_MAX_GROUPS 1024

/* The token capacity (columns per feature) of a grouped columnwise copy of
 * `tokens` rows in `groups` groups: tokens + (FP8KIT_GEMM_DIM_MULTIPLE - 1)
 * * groups, the most the padded blocks can take whatever the sizes. */
FP8KIT_API int64_t fp8kit_grouped_columnwise_tokens(int64_t tokens, int64_t groups);

/* Checks `group_sizes` (int64 [E], on the CPU or a CUDA device: then read
 * to the host, a wait on `stream`) as the token-grouped ops check them
 * against their input: every size in [0, tokens], their sum exactly
 * `tokens`. The block-scaled ops take their tensors in the padded row
 * layout, whose rows are no token count, and check only that the padded
 * groups fit: a front end checks the sizes against its real tokens with
 * this before it pads them. */
FP8KIT_API fp8kit_status fp8kit_grouped_check_sizes(const fp8kit_tensor* group_sizes,
                                                    int64_t tokens, void* stream);

/* Per-group per-tensor quantization of a token-grouped input in one pass
 * over it (current scaling: an amax pass first).
 *   input:       [T, F] float32/bfloat16/float16, F a positive multiple of
 *                FP8KIT_GEMM_DIM_MULTIPLE.
 *   group_sizes: int64 [E], E >= 1 (see above).
 *   output:      E4M3 or E5M2, PER_TENSOR, shape [T, F], on input's device;
 *                data (rowwise [T, F]) and/or columnwise_data (the grouped
 *                columnwise copy above); scale, scale_inv, amax: per-group
 *                scales as above (amax may be NULL when `current` is NULL).
 *   current:     NULL: each group is cast with its scale in output->scale
 *                (fp8kit_grouped_quantize_delayed_update below keeps a
 *                delayed-scaling state per group); else current scaling with
 *                this config, group g's scale written from its amax
 *                (an empty group has amax 0 and so scale 1).
 * Group g's scale_inv = 1 / the scale it was cast with. */
FP8KIT_API fp8kit_status fp8kit_grouped_quantize(const fp8kit_tensor* input,
                                                 const fp8kit_tensor* group_sizes,
                                                 fp8kit_tensor* output,
                                                 const fp8kit_current_scaling_config* current,
                                                 void* stream);

/* Delayed scaling over groups: one scaling state per group, every pointer
 * on the op's device, no two overlapping. Unlike the single-tensor
 * fp8kit_delayed_quantize_state it has no amax accumulator, counter or
 * scale_inv: each group's amax is its own rows' (nothing from elsewhere is
 * folded in) and is written to output->amax (the CUDA update is a launch
 * of its own, so no kernel has to count blocks to find its last one), and
 * the GEMMs read 1/the scale used from output->scale_inv. */
typedef struct fp8kit_grouped_delayed_state {
  float* amax_history; /* [E, amax_history_len]: row g is group g's, element
                        * 0 its newest amax */
  float* scale;        /* E * FP8KIT_GROUP_SCALE_STRIDE floats, group g's at
                        * g * FP8KIT_GROUP_SCALE_STRIDE: read (the scale of a
                        * seeded group), written when recording */
  float* seeded;       /* NULL (every group seeded) or laid out as scale:
                        * 0 fresh, 1 seeded (a float, as in
                        * fp8kit_delayed_quantize_state) */
} fp8kit_grouped_delayed_state;

/* Delayed-scaling quantization of a token-grouped input with each group's
 * state updated, in one pass over the input (a second, reading only the
 * rows of fresh groups, when `state->seeded` is set). Its effect on group
 * g is exactly that of fp8kit_quantize_delayed_update on g's rows alone
 * with g's state (its accumulator 0 on entry, no column sums):
 *   1. the scale used: state->scale[g], or for a fresh group the seed
 *      scale from its own amax (an empty group's amax is 0: it keeps its
 *      scale); the scale policy of fp8kit/quantize.h applied to it;
 *   2. its rows cast with it into output->data and its block of the
 *      grouped columnwise copy (whichever are set); output->scale[g] =
 *      the scale used, output->scale_inv[g] = 1 / it, output->amax[g] =
 *      its amax (NaN written as the canonical NaN);
 *   3. record != 0 (a pass that computes gradients): the amax rolled into
 *      history row g and state->scale[g] recomputed by the rule of
 *      fp8kit_delayed_scaling_update, the scale used being the previous
 *      scale; then state->seeded[g] = 1 (when set). record == 0: the state
 *      is left as it is.
 *   input, group_sizes, output: as for fp8kit_grouped_quantize; output's
 *               scale, scale_inv and amax are all required (written).
 *   config:     amax_history_len (the columns of the history), margin and
 *               reduction, checked as fp8kit_delayed_scaling_update does.
 * The CPU and CUDA paths agree bit for bit. Calls sharing a state must not
 * run concurrently. */
FP8KIT_API fp8kit_status fp8kit_grouped_quantize_delayed_update(
    const fp8kit_tensor* input, const fp8kit_tensor* group_sizes, fp8kit_tensor* output,
    const fp8kit_grouped_delayed_state* state, const fp8kit_delayed_scaling_config* config,
    int record, void* stream);

/* The floats the block scales of one copy of a padded grouped tensor can
 * take: `rows` rows (at least the sum of the padded group sizes) in
 * `groups` groups of `features` columns, `mode` BLOCK_1X128 or
 * BLOCK_128X128, the rowwise copy's scales (columnwise = 0) or the
 * columnwise copy's (1); an upper bound for any group sizes. */
FP8KIT_API int64_t fp8kit_grouped_block_scales_floats(int64_t rows, int64_t groups,
                                                      int64_t features, fp8kit_scaling_mode mode,
                                                      int columnwise);

/* Block-scaled quantization of a grouped tensor in the padded row layout:
 * group g's rows [P_g, P_g + p_g) exactly as fp8kit_quantize_block_scaling
 * quantizes them as a tensor of their own.
 *   input:       [rows, F] float32/bfloat16/float16 in the padded row
 *                layout, rows >= P_E (the rows after the last group are
 *                read by nothing; their outputs are written as zeros).
 *   group_sizes: the real rows m_g of each group (see above).
 *   output:      E4M3 or E5M2, BLOCK_1X128 or BLOCK_128X128, shape [rows,
 *                F]; data [rows, F] with block_scale_inv and/or
 *                columnwise_data (F * rows elements) with
 *                columnwise_block_scale_inv, each scale array holding
 *                fp8kit_grouped_block_scales_floats floats (16-byte
 *                aligned; floats after the last group's are zeroed).
 *   config:      amax_epsilon and power_2_scale, as for a single tensor.
 * On CUDA one launch quantizes every group. */
FP8KIT_API fp8kit_status fp8kit_grouped_quantize_block(const fp8kit_tensor* input,
                                                       const fp8kit_tensor* group_sizes,
                                                       fp8kit_tensor* output,
                                                       const fp8kit_current_scaling_config* config,
                                                       void* stream);

/* The three GEMMs of a grouped Linear, y_g = x_g @ w_g^T per group g. */
typedef enum fp8kit_grouped_gemm_kind {
  /* D [T, N] token-grouped, D_g = A_g @ op(B_g): A token-grouped [T, K]
   * (rowwise data); B expert-stacked, op(B_g) = B_g^T for trans_b = 1
   * (B [E, N, K]: the forward y = x @ w^T with torch's weight layout) or
   * B_g for trans_b = 0 (B [E, K, N]: the dgrad dx = dy @ w, or a JAX
   * kernel in the forward); each B_g read K-contiguous as fp8kit_gemm
   * reads a single B (its columnwise copy on TN-only devices). A group
   * with no tokens writes nothing. */
  FP8KIT_GROUPED_GEMM_TOKENS = 0,
  /* D [E, M, N] expert-stacked, D_g = A_g^T @ B_g summed over group g's
   * tokens: A [T, M] and B [T, N] token-grouped, both read from their
   * grouped columnwise copies (the weight gradient dw_g = dy_g^T @ x_g). A
   * group with no tokens gets D_g = 0. */
  FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS = 1
} fp8kit_grouped_gemm_kind;

typedef struct fp8kit_grouped_gemm_config {
  int trans_b;            /* FP8KIT_GROUPED_GEMM_TOKENS only; see above */
  const void* bias;       /* NULL, or [E, N] (TOKENS only): bias row g added
                           * to D_g, dtype bias_dtype as for fp8kit_gemm */
  fp8kit_dtype bias_dtype;
  /* As for fp8kit_gemm: 1 promotes partial sums to FP32 (more accurate). */
  int use_split_accumulator;
} fp8kit_grouped_gemm_config;

/* a, b: E4M3 or E5M2 (not both E5M2), PER_TENSOR with per-group scale_inv (see
 *       above), 16-byte aligned, holding the copies `kind` reads; or both
 *       block-scaled (not both 128x128), each group's block scales as
 *       fp8kit_grouped_quantize_block lays them out. Block-scaled
 *       token-grouped operands and D are in the padded row layout: TOKENS
 *       multiplies group g's p_g padded rows (D [rows, N] with rows >= P_E,
 *       the padded rows' outputs written too, those after P_E zeroed)
 *       and CONTRACT_TOKENS contracts its p_g padded tokens. D is bfloat16
 *       or float32 then, and the bias of TOKENS in D's dtype rules for
 *       block-scaled GEMMs.
 * d:    bfloat16, float16 or float32, the shape `kind` gives.
 * All on one device; `stream` is a cudaStream_t or NULL. The alignment
 * and type rules of fp8kit_gemm hold for every group's GEMM (K and N
 * multiples of FP8KIT_GEMM_DIM_MULTIPLE). */
FP8KIT_API fp8kit_status fp8kit_grouped_gemm(fp8kit_grouped_gemm_kind kind,
                                             const fp8kit_tensor* a, const fp8kit_tensor* b,
                                             fp8kit_tensor* d, const fp8kit_tensor* group_sizes,
                                             const fp8kit_grouped_gemm_config* config,
                                             void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_GROUPED_H_ */
