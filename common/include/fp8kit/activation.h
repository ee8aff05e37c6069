/* The activations of an MLP with the FP8 cast of their outputs fused in
 * (fp8kit/fused_cast.h): GELU (tanh approximation) and SwiGLU.
 *
 * Shapes (any rank >= 1; rows = prod(shape[:-1]), may be 0; F a positive
 * multiple of FP8KIT_GEMM_DIM_MULTIPLE, the next GEMM's inner dimension):
 *   GELU:   h [rows, F]  -> a [rows, F]
 *   SwiGLU: h [rows, 2F] = [gate | up] along the last dimension
 *           (gate = h[..., :F], up = h[..., F:]) -> a [rows, F]
 * h, a, d_a and dh are float32, bfloat16 or float16, all of h's dtype;
 * every data pointer is 16-byte aligned (the CUDA kernels' vectors; the
 * CPU refuses what the GPU would).
 *
 * Arithmetic: float32, every operation an IEEE one (fma, correctly rounded
 * + - *, min/max) in this order, except the sigmoid's e^-|x| and division:
 *   sigmoid(x): e = e^-|x|, q = e / (1 + e); sigmoid(x) = 1 - q and
 *               1 - sigmoid(x) = q for x >= 0, the other way round for x < 0
 * On the CPU (the reference) e and q are fp8kit's own, within 2.4 ulp of
 * exact; on CUDA they come from the special function unit (2^x and
 * reciprocal), which halves the kernels' time. Bound, checked on every GPU
 * run (tests/cpp/activation_gpu_test.cc): each float32 value v the CUDA
 * kernels compute is within 2^-18 |v| + 2^-20 amax of the CPU reference's,
 * amax the largest finite |v| of the tensor. The FP8 cast of a given
 * float32 value is bit-identical on both, so the FP8 bytes are equal or
 * one step apart (where v sits at a rounding boundary), and amax, scales
 * and column sums agree within the same bound.
 *   GELU:   0.5 (1 + tanh(u)) = sigmoid(2u): v = 2k0 * fma(k1, (x * x) * x, x),
 *           k0 = sqrt(2/pi), k1 = 0.044715, s = sigmoid(v);
 *           a = max(x, -FLT_MAX) * s  (-0 at -inf)
 *           gelu'(x) = fma(c * (s * (1 - s)), 2k0 * fma(3 k1, c * c, 1), s),
 *                      c = x clamped to [-16, 16] (s (1 - s) = 0 beyond)
 *   SwiGLU: silu(g) = max(g, -FLT_MAX) * s, s = sigmoid(g);  a = silu(gate) * up
 *           silu'(g) = fma(g clamped to +-FLT_MAX, s * (1 - s), s)
 * Backward: GELU dh = d_a * gelu'(h); SwiGLU d_gate = (d_a * up) *
 * silu'(gate), d_up = d_a * silu(gate), dh = [d_gate | d_up].
 * The FP8 cast reads these float32 values; the optional high-precision
 * output is the same value rounded to h's dtype (RNE, NaN canonical). */
#ifndef FP8KIT_ACTIVATION_H_
#define FP8KIT_ACTIVATION_H_

#include "fp8kit/column_sums.h"
#include "fp8kit/export.h"
#include "fp8kit/fused_cast.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fp8kit_activation {
  FP8KIT_GELU = 0,  /* tanh approximation */
  FP8KIT_SWIGLU = 1 /* silu(gate) * up */
} fp8kit_activation;

/* Without a cast: the FP8 output and `cast` NULL (and `sums` NULL), the
 * high-precision output then required. Block scaling's layers take that
 * output to their own block cast. */

/* Forward: a = act(h).
 *   a:     NULL, or h's dtype, [rows, F]: the high-precision output.
 *   a_fp8: [rows, F], written by `cast` (fp8kit/fused_cast.h): rowwise for
 *          the next forward GEMM, columnwise for its wgrad. */
FP8KIT_API fp8kit_status fp8kit_activation_forward(fp8kit_activation act, const fp8kit_tensor* h,
                                                   fp8kit_tensor* a, fp8kit_tensor* a_fp8,
                                                   const fp8kit_fused_cast* cast, void* stream);

/* Backward: dh = d_a * act'(h).
 *   d_a:    [rows, F], h's dtype.
 *   dh:     NULL, or h's dtype and shape: the high-precision gradient.
 *   dh_fp8: h's shape, written by `cast` (rowwise and columnwise for the
 *           dgrad and wgrad GEMMs of the Linear that produced h).
 *   sums:   NULL (or a NULL `sums` field) for none; otherwise the column
 *           sums of dh (the bias gradient of that Linear), as
 *           fp8kit/column_sums.h says (needs dh_fp8->columnwise_data). */
FP8KIT_API fp8kit_status fp8kit_activation_backward(fp8kit_activation act,
                                                    const fp8kit_tensor* d_a,
                                                    const fp8kit_tensor* h, fp8kit_tensor* dh,
                                                    fp8kit_tensor* dh_fp8,
                                                    const fp8kit_fused_cast* cast,
                                                    const fp8kit_column_sums* sums, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_ACTIVATION_H_ */
