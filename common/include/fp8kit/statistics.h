/* Cast statistics: what a cast to FP8 did to a tensor, computed from the
 * high-precision input and the FP8 copy the cast wrote, beside the cast
 * (the FP8 copy is read as it is; nothing is re-quantized here).
 *
 * For each element x of the input, q is its FP8 code in the copy read and
 * d = q * scale_inv its dequantized value exactly as fp8kit_dequantize
 * computes it (one float32 multiply by the tensor's scale_inv, or by the
 * element's block's). Then:
 *   amax      = max |x| over all elements, NaN-propagating as fp8kit_amax
 *               (a NaN anywhere gives NaN, +-inf gives inf);
 *   underflow = #{x finite, x != 0, q = +-0}: values the cast flushed to
 *               zero (exact zeros are not counted);
 *   saturated = #{x finite, q = +-fp8_max} (448 for E4M3, 57344 for E5M2):
 *               values clipped to the format's range, and values that land
 *               on fp8_max exactly. Under current or block scaling with
 *               exact scales (no power_2_scale) the element at each
 *               block's (or the tensor's) amax maps to fp8_max by
 *               construction, so there this count is at least the number
 *               of blocks whose amax is finite and non-zero; a scale
 *               rounded down to a power of two maps it below fp8_max;
 *   error_sq  = sum over finite x of (d - x)^2;
 *   norm_sq   = sum over finite x of x^2.
 * Non-finite x (+-inf, NaN) are left out of the counts and the sums; only
 * amax sees them. What a user reads off them:
 *   relative error   sqrt(error_sq / norm_sq)   (norm_sq = 0: no signal);
 *   SQNR in dB       10 * log10(norm_sq / error_sq);
 *   underflow rate   underflow / numel;  saturation rate  saturated / numel.
 * A finite x whose copy is non-finite (a bad scale makes every code NaN,
 * fp8kit/quantize.h; a scale_inv so large that q * scale_inv overflows)
 * makes error_sq NaN or inf: the cast lost that element, and the sum says
 * so instead of hiding it. The float32 sums overflow to inf beyond FLT_MAX
 * (|x| around 1.8e19 and above). An empty tensor gives 0 everywhere.
 *
 * Precision and reproducibility. The CPU reference accumulates the sums in
 * double in element order and rounds each once to float32: deterministic.
 * The CUDA kernel accumulates per thread in double, reduces each thread
 * block in double, adds the (at most 128) block sums in block order in
 * double and rounds once to float32: the same bits on every run, and within
 * 1e-5 relative of the CPU's (the two differ only in the order of the
 * double additions, every term non-negative). amax and the counts are exact and
 * bit-identical between CPU and CUDA (a NaN amax is 0x7FC00000 on both). */
#ifndef FP8KIT_STATISTICS_H_
#define FP8KIT_STATISTICS_H_

#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device scratch the CUDA statistics kernels take (the partial
 * sums of their thread blocks). The caller gives it, as with every fp8kit
 * workspace, so that a call allocates nothing: a call recorded into a CUDA
 * graph (XLA's command buffers, torch's graph capture) stays a plain
 * kernel node, where a stream-ordered allocation inside a graph that is
 * nested into another is refused by CUDA. */
#define FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES 2048

/* Where fp8kit_cast_statistics_of writes: each output pointer one value on
 * the call's device (the input's), all required and all written. */
typedef struct fp8kit_cast_statistics {
  float* amax;              /* max |x|, NaN-propagating */
  unsigned int* underflow;  /* finite x != 0 cast to +-0 */
  unsigned int* saturated;  /* finite x cast to +-fp8_max */
  float* error_sq;          /* sum over finite x of (q * scale_inv - x)^2 */
  float* norm_sq;           /* sum over finite x of x^2 */
  void* workspace;          /* FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES on the device,
                             * 8-byte aligned, contents ignored and overwritten; a
                             * CPU call ignores it (NULL allowed there) */
} fp8kit_cast_statistics;

/* The statistics of the cast of `input` into `quantized` (see above).
 *   input:     float32/bfloat16/float16, the high-precision tensor, any rank
 *              (rank 0 counts as [1]); fewer than 2^32 elements (the counts
 *              are 32-bit).
 *   quantized: its FP8 copy, E4M3 or E5M2, same shape and device as input:
 *              PER_TENSOR with scale_inv, or BLOCK_1X128 / BLOCK_128X128
 *              with the scales of the copy read (fp8kit/block_scaling.h).
 *              Read: data and block_scale_inv, or, when from_columnwise !=
 *              0, columnwise_data (the transpose, read back in the logical
 *              order as fp8kit_dequantize does) and
 *              columnwise_block_scale_inv.
 *   out:       the five outputs, all non-NULL, and the workspace (CUDA).
 * One pass over the input: on CUDA, a zeroing of the outputs and one kernel
 * on `stream` (a cudaStream_t, NULL = default stream), asynchronous; on the
 * CPU, synchronous (`stream` ignored). */
FP8KIT_API fp8kit_status fp8kit_cast_statistics_of(const fp8kit_tensor* input,
                                                   const fp8kit_tensor* quantized,
                                                   int from_columnwise,
                                                   const fp8kit_cast_statistics* out,
                                                   void* stream);

/* fp8kit_cast_statistics_of for a copy cast with a scale per row: row r of
 * `input` (its [prod(leading), last] view) was cast into the rowwise copy
 * quantized->data with the scale whose inverse is row_scale_inv[r]. A
 * grouped tensor's per-tensor copy (fp8kit/grouped.h: each group's rows
 * share that group's scale) is read as one this way, with each row's
 * group's scale_inv gathered into row_scale_inv: one pass for all the
 * groups, and no group sizes needed on the host.
 *   quantized:     PER_TENSOR, input's shape and device; data read, its
 *                  scale_inv not.
 *   row_scale_inv: FP8KIT_FLOAT32, one element per row ([rows] or any shape
 *                  of rows elements), contiguous, on input's device.
 * Otherwise as fp8kit_cast_statistics_of (from_columnwise = 0). */
FP8KIT_API fp8kit_status fp8kit_cast_statistics_of_rows(const fp8kit_tensor* input,
                                                        const fp8kit_tensor* quantized,
                                                        const fp8kit_tensor* row_scale_inv,
                                                        const fp8kit_cast_statistics* out,
                                                        void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_STATISTICS_H_ */
