/* LayerNorm and RMSNorm over the last dimension, with the FP8 cast of the
 * output fused into the forward (fp8kit/fused_cast.h).
 *
 * Shapes: x is [rows, hidden] (any rank >= 1; rows = prod(shape[:-1]), may
 * be 0), float32, bfloat16 or float16; hidden is a positive multiple of
 * FP8KIT_GEMM_DIM_MULTIPLE (the next GEMM's inner dimension). gamma and
 * beta are [hidden] in x's dtype; mean and rsigma are float32 [rows]. Every
 * data pointer is 16-byte aligned (the CUDA kernels use 16-byte vectors;
 * the CPU refuses what the GPU would).
 *
 * Arithmetic: float32, every operation correctly rounded (no fast-math,
 * no rsqrt), in the order below on the CPU and on CUDA alike, so that
 * mean, rsigma, y and the FP8 bytes agree bit for bit.
 *
 * Row sums. sum(a) over a row of a_0..a_{hidden-1}: the row is cut into
 * chunks of 8 consecutive elements, chunk k going to lane k mod 32; lane l
 * adds the elements of its chunks in index order to 0.0f; then for
 * o = 16, 8, 4, 2, 1: lane l += lane l+o (l < o); the sum is lane 0.
 *
 * Forward, per row (H = hidden as a float, exact):
 *   LayerNorm: mean = sum(x) / H;  var = sum((x - mean) * (x - mean)) / H
 *              (two passes); rsigma = 1 / sqrt(var + epsilon);
 *              y = fma((x - mean) * rsigma, gamma, beta)
 *   RMSNorm:   ms = sum(x * x) / H;  rsigma = 1 / sqrt(ms + epsilon);
 *              y = (x * rsigma) * gamma
 * The FP8 cast reads the float32 y; the optional high-precision y is it
 * rounded to x's dtype (RNE). A NaN written to a float32 output (y, mean,
 * rsigma) is the canonical 0x7FC00000.
 *
 * Backward, per row, with xhat as in the forward ((x - mean) * rsigma or
 * x * rsigma) and g = dy * gamma:
 *   LayerNorm: c1 = sum(xhat * g) / H;  c2 = sum(g) / H;
 *              dx = (g - fma(xhat, c1, c2)) * rsigma
 *   RMSNorm:   c1 = sum(xhat * g) / H;  dx = (g - xhat * c1) * rsigma
 * and per column c: dgamma[c] = sum over rows of dy * xhat, dbeta[c] = sum
 * over rows of dy, in this order: rows are cut into tiles of
 * FP8KIT_NORM_BACKWARD_TILE_ROWS; a tile's partial adds its rows in order
 * to 0.0f; tiles are cut into groups of FP8KIT_NORM_BACKWARD_GROUP_TILES,
 * a group's partial adds its tiles' partials in order to 0.0f; the total
 * adds the group partials in order to 0.0f; then it is rounded to the
 * output's dtype (RNE, NaN canonical). */
#ifndef FP8KIT_NORMALIZATION_H_
#define FP8KIT_NORMALIZATION_H_

#include <stdint.h>

#include "fp8kit/export.h"
#include "fp8kit/fused_cast.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8KIT_NORM_BACKWARD_TILE_ROWS 32
#define FP8KIT_NORM_BACKWARD_GROUP_TILES 16

typedef enum fp8kit_norm_type {
  FP8KIT_LAYERNORM = 0, /* (x - mean) / sigma * gamma + beta */
  FP8KIT_RMSNORM = 1    /* x / rms * gamma, no beta, no mean */
} fp8kit_norm_type;

typedef struct fp8kit_norm_config {
  fp8kit_norm_type type;
  float epsilon; /* finite and >= 0 */
} fp8kit_norm_config;

/* Forward.
 *   x, gamma, beta (LayerNorm only; NULL for RMSNorm): inputs as above.
 *   y:      NULL, or x's dtype and shape: the high-precision output.
 *   y_fp8:  the FP8 output (x's shape), written by `cast` as
 *           fp8kit/fused_cast.h describes; or NULL with `cast` NULL: no
 *           cast, y (then required), mean and rsigma alone (the input of
 *           a cast that needs more than one scale, block scaling's).
 *   mean:   LayerNorm: float32 [rows], written; RMSNorm: NULL.
 *   rsigma: float32 [rows], written.
 * One pass over x for delayed scaling with a seeded slot; an amax pass
 * first for current scaling and a fresh slot. */
FP8KIT_API fp8kit_status fp8kit_norm_forward(const fp8kit_norm_config* config,
                                             const fp8kit_tensor* x, const fp8kit_tensor* gamma,
                                             const fp8kit_tensor* beta, fp8kit_tensor* y,
                                             fp8kit_tensor* y_fp8, const fp8kit_fused_cast* cast,
                                             fp8kit_tensor* mean, fp8kit_tensor* rsigma,
                                             void* stream);

/* Floats of workspace fp8kit_norm_backward needs for x [rows, hidden]:
 * 2 * ceil(rows / FP8KIT_NORM_BACKWARD_TILE_ROWS) * hidden (0 when empty). */
FP8KIT_API int64_t fp8kit_norm_backward_workspace(int64_t rows, int64_t hidden);

/* Backward.
 *   dy, x:        x's dtype and shape;
 *   mean, rsigma: what the forward wrote (mean NULL for RMSNorm);
 *   gamma:        as in the forward;
 *   dx:           x's dtype and shape, written;
 *   dgamma:       [hidden], float32, bfloat16 or float16, written;
 *   dbeta:        LayerNorm: like dgamma, written; RMSNorm: NULL;
 *   workspace:    fp8kit_norm_backward_workspace(rows, hidden) floats on
 *                 x's device (NULL when that is 0).
 * rows == 0 gives dgamma = dbeta = 0. */
FP8KIT_API fp8kit_status fp8kit_norm_backward(const fp8kit_norm_config* config,
                                              const fp8kit_tensor* dy, const fp8kit_tensor* x,
                                              const fp8kit_tensor* mean,
                                              const fp8kit_tensor* rsigma,
                                              const fp8kit_tensor* gamma, fp8kit_tensor* dx,
                                              fp8kit_tensor* dgamma, fp8kit_tensor* dbeta,
                                              float* workspace, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_NORMALIZATION_H_ */
