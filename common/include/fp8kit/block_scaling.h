/* Block-scaled FP8: one float32 scale per 1x128 tile (activations and
 * gradients) or per 128x128 block (weights) instead of one per tensor, so an
 * outlier costs precision only in its own block.
 *
 * Blocks. A tensor is viewed as [rows, cols] = [prod(shape[:-1]), shape[-1]]
 * (rank 0 as [1, 1]). Each stored copy is blocked as a GEMM reads it, along
 * its own last (K-contiguous) dimension:
 *   rowwise copy    (`data`)            stored [rows, cols]
 *   columnwise copy (`columnwise_data`) stored [cols, rows], the transpose
 * For a stored copy [R, C]:
 *   FP8KIT_SCALING_BLOCK_1X128:   tile (r, j) is stored row r, columns
 *     128j .. 128j+127 (the last tile of a row is shorter when C % 128 != 0).
 *     The rowwise copy's tiles run along cols; the columnwise copy's run
 *     along rows (128x1 tiles of the logical tensor), with scales of their
 *     own.
 *   FP8KIT_SCALING_BLOCK_128X128: block (i, j) is stored rows 128i.., columns
 *     128j.. (edge blocks smaller). Both copies cover the same blocks of the
 *     logical tensor, so they hold the same scale values in transposed
 *     layouts.
 *
 * The rule, per block (the per-tensor rule of current scaling,
 * fp8kit_quantize_current_scaling, applied to each block; float32 math,
 * every operation one correctly rounded IEEE operation, no FMA):
 *   amax = max |x| over the block's elements (NaN if one of them is NaN);
 *   amax zero, NaN or +inf           -> scale = 1;
 *   otherwise scale = fp8_max / max(amax, amax_epsilon), fp8_max = 448 (E4M3)
 *     or 57344 (E5M2), clamped to FLT_MAX if it overflows;
 *   power_2_scale: scale then rounded down to a power of two (its mantissa
 *     bits cleared), which makes scale_inv exact; but not below
 *     fp8_max / FLT_MAX: where rounding down would go below it (amax above
 *     about 1.75 * 2^127) the power of two above is taken;
 *   q = saturate(round_to_nearest_even(x * scale)) as in fp8kit_quantize:
 *     saturation for finite x only, +-inf -> NaN (E4M3) or +-inf (E5M2),
 *     NaN -> 0x7F;
 *   scale_inv = 1 / scale, the only scale stored.
 * Every scale is thus >= fp8_max / FLT_MAX (rounded), so fp8_max *
 * scale_inv <= FLT_MAX and no finite input dequantizes to inf (a block of
 * values near FLT_MAX included). A block of zeros has q = 0 and scale_inv =
 * 1. A block holding a NaN or an inf is cast with scale 1: the NaN or inf
 * element stays non-finite (so the GEMM rows or columns that read it come
 * out non-finite, as in bf16) while its finite neighbours keep their values
 * up to FP8 rounding (beyond fp8_max they saturate, below the smallest
 * subnormal they flush to 0), instead of all becoming 0 as a scale of
 * fp8_max / inf = 0 would make them. Other blocks are not affected. CPU and
 * CUDA give the same bits.
 *
 * Scale layout: the one cuBLASLt reads on Hopper with
 * CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F (1x128) and
 * CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F (128x128). For a stored copy
 * [R, C], a row-major float32 array [outer, inner]:
 *   BLOCK_1X128:   [ceil(C/128), round_up(R, 4)]; tile (r, j) at j * inner + r
 *                  (consecutive rows contiguous);
 *   BLOCK_128X128: [ceil(R/128), round_up(ceil(C/128), 4)]; block (i, j) at
 *                  i * inner + j.
 * The inner dimension is padded to a multiple of 4 floats (16 bytes); the
 * quantizer writes 0 into the padding, which no GEMM reads.
 * fp8kit_block_scale_inv_shape computes [outer, inner]. */
#ifndef FP8KIT_BLOCK_SCALING_H_
#define FP8KIT_BLOCK_SCALING_H_

#include <stdint.h>

#include "fp8kit/export.h"
#include "fp8kit/quantize.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements along a block side. */
#define FP8KIT_BLOCK_LEN 128

/* The inner dimension of a block scale array is padded to a multiple of
 * this (see the layout above). */
#define FP8KIT_BLOCK_SCALE_INNER_MULTIPLE 4

/* shape[0], shape[1] = [outer, inner] of t's block_scale_inv (columnwise = 0)
 * or columnwise_block_scale_inv (columnwise = 1): see the layout above. Reads
 * t->scaling_mode (BLOCK_1X128 or BLOCK_128X128), rank and shape only. */
FP8KIT_API fp8kit_status fp8kit_block_scale_inv_shape(const fp8kit_tensor* t, int columnwise,
                                                      int64_t shape[2]);

/* Block-scaled quantization, everything in one pass over the input.
 *   input:  float32/bfloat16/float16, any rank (rank 0 counts as [1]).
 *   output: dtype E4M3 or E5M2, scaling_mode BLOCK_1X128 or BLOCK_128X128,
 *           same shape and device as input. Written: data with
 *           block_scale_inv (the rowwise copy) and/or columnwise_data with
 *           columnwise_block_scale_inv (the columnwise copy); at least one
 *           copy, each with its scales. scale, scale_inv and amax must be
 *           NULL: a block-scaled tensor has no per-tensor scale.
 * Scale arrays are 16-byte aligned (cuBLASLt reads them so) and hold
 * fp8kit_block_scale_inv_shape floats.
 * config: amax_epsilon and power_2_scale as in current scaling (the rule
 *         above). */
FP8KIT_API fp8kit_status fp8kit_quantize_block_scaling(const fp8kit_tensor* input,
                                                       fp8kit_tensor* output,
                                                       const fp8kit_current_scaling_config* config,
                                                       void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_BLOCK_SCALING_H_ */
