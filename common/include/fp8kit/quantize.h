/* Per-tensor FP8 quantization, and dequantization of per-tensor and
 * block-scaled tensors (block-scaled quantization: fp8kit/block_scaling.h).
 *
 * Scale convention: see fp8kit/tensor.h. Each element x is cast as
 * x * scale (one float32 multiply), rounded to nearest even. Saturation is
 * for finite values only:
 *   finite x, |x * scale| beyond the format's largest finite value (a
 *     product that overflows float32 included) -> +-max (+-448 for E4M3,
 *     +-57344 for E5M2);
 *   x = +-inf -> NaN (0x7F) in E4M3, which has no inf; +-inf (0x7C, 0xFC)
 *     in E5M2;
 *   x = NaN   -> NaN (0x7F, whatever the sign, in both formats).
 * So an inf or NaN in the input (an overflow or a divergence upstream)
 * dequantizes to a non-finite value and makes the GEMMs that read it give
 * a non-finite output, as the same GEMM in bf16 would, instead of a
 * plausible finite one. Results are bit-identical between the CPU and CUDA
 * implementations. */
#ifndef FP8KIT_QUANTIZE_H_
#define FP8KIT_QUANTIZE_H_

#include "fp8kit/column_sums.h"
#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Quantize with the scale already in output->scale (delayed scaling).
 *   input:  float32/bfloat16/float16, any rank (rank 0 counts as [1]).
 *   output: dtype E4M3 or E5M2, scaling_mode PER_TENSOR, same shape and
 *           device as input. Fields read: scale (required). Fields written,
 *           each only when non-NULL: data (rowwise), columnwise_data
 *           (transposed [last dim, prod(leading dims)]), scale_inv
 *           (= 1/scale), amax (= max |input|, NaN-propagating).
 * At least one of data and columnwise_data must be non-NULL. Everything is
 * produced in one pass over the input.
 *
 * Scale policy, for every quantization with a given scale (this function
 * and fp8kit_quantize_delayed_update, which applies it to the scale it
 * uses): a scale that is finite and > 0, a positive denormal included, is
 * used as it is. Any other scale (0, negative, +-inf, NaN) makes every
 * output element the FP8 NaN code 0x7F (NaN in E4M3 and E5M2 alike),
 * rowwise and columnwise, and scale_inv NaN, so that a bad scale never
 * gives a plausible result. The amax (and column sums) are still those of
 * the input. The scale is checked where it is read, on the device, so the
 * call neither syncs nor fails for it; CPU and CUDA agree bit for bit
 * (NaN scale_inv is 0x7FC00000 on both). */
FP8KIT_API fp8kit_status fp8kit_quantize(const fp8kit_tensor* input, fp8kit_tensor* output,
                                         void* stream);

typedef struct fp8kit_current_scaling_config {
  /* The scale is computed from max(amax, amax_epsilon); finite and >= 0
   * (0 disables it). */
  float amax_epsilon;
  /* Round the scale down to a power of two (exact scale_inv). */
  int power_2_scale;
} fp8kit_current_scaling_config;

/* Current scaling: amax of this tensor, then scale, then cast, in two passes
 * over the input (one reduction, one cast). output->scale, scale_inv and amax
 * are all required and written. A zero or non-finite amax gives scale 1:
 * a tensor holding an inf or a NaN is cast unscaled, that element becoming
 * non-finite (the rule above) and the finite ones keeping their values up
 * to FP8 rounding (a value beyond fp8_max saturates, one below the
 * smallest subnormal flushes to 0), where fp8_max / inf = 0 would have
 * flushed them all. Other fields as for fp8kit_quantize.
 * sums: NULL (or a NULL `sums` field) for none; otherwise the cast pass
 * also writes the column sums of the input, in the order and under the
 * conditions of fp8kit/column_sums.h (a columnwise output, rows > 1 and
 * cols > 1), as fp8kit_quantize_delayed_update does.
 * The scale rule exactly (common/src/compute_scale.h, same on CPU and CUDA):
 *   amax zero (whatever the epsilon), negative, NaN or inf  -> scale 1;
 *   else scale = fp8_max / max(amax, amax_epsilon) in float32, clamped to
 *   FLT_MAX if it overflows, then (power_2_scale) rounded down to a
 *   power of two, or up where rounding down would take it below
 *   fp8_max / FLT_MAX (amax above about 1.75 * 2^127: 2^-119 instead of
 *   2^-120 for E4M3, 2^-112 instead of 2^-113 for E5M2); scale_inv =
 *   1 / scale. Every computed scale is thus >= fp8_max / FLT_MAX (rounded),
 *   so fp8_max * scale_inv <= FLT_MAX: a finite input never dequantizes to
 *   inf. */
FP8KIT_API fp8kit_status fp8kit_quantize_current_scaling(
    const fp8kit_tensor* input, fp8kit_tensor* output,
    const fp8kit_current_scaling_config* config, const fp8kit_column_sums* sums, void* stream);

/* fp8kit_quantize_current_scaling of count tensors (0..64) on one device,
 * with the same outputs, bit for bit, as one call per tensor (sums: NULL
 * or count entries, an entry with a NULL `sums` field writing none). Each
 * output's amax, scale and scale_inv are its own: no two outputs may share
 * one. Why: a small layer is bound by launches, and one tensor takes three
 * (zero the amax, the amax pass, the cast pass); on CUDA this takes three
 * for all of them, and one cast launch for up to four tensors that share
 * a kernel (input dtype, FP8 dtype, copies, column sums or not), as
 * fp8kit_quantize_delayed_update groups its casts. */
FP8KIT_API fp8kit_status fp8kit_quantize_current_scaling_many(
    const fp8kit_tensor* inputs, fp8kit_tensor* outputs, const fp8kit_column_sums* sums,
    int count, const fp8kit_current_scaling_config* config, void* stream);

/* Scale from an amax already on the device: the step current scaling uses
 * between its two passes, exposed for callers that reduce amax themselves
 * (for example across devices). All three pointers are one float on
 * (device_type, device_index). */
FP8KIT_API fp8kit_status fp8kit_compute_scale(const float* amax, float* scale, float* scale_inv,
                                              fp8kit_dtype fp8_dtype,
                                              const fp8kit_current_scaling_config* config,
                                              fp8kit_device_type device_type, int device_index,
                                              void* stream);

/* Dequantize: output = q * scale_inv (one float32 multiply).
 *   input:  E4M3 or E5M2 with data (rowwise) or, when from_columnwise != 0,
 *           columnwise_data, and its scales: scale_inv for PER_TENSOR;
 *           block_scale_inv or columnwise_block_scale_inv, each element
 *           multiplied by its block's, for BLOCK_1X128 and BLOCK_128X128
 *           (fp8kit/block_scaling.h).
 *   output: float32/bfloat16/float16 with the input's logical shape (the
 *           columnwise copy is transposed back). */
FP8KIT_API fp8kit_status fp8kit_dequantize(const fp8kit_tensor* input, fp8kit_tensor* output,
                                           int from_columnwise, void* stream);

/* Columnwise from rowwise: writes tensor->columnwise_data, the transpose of
 * tensor->data (the 2-D view [prod(shape[:-1]), shape[-1]] stored as
 * [shape[-1], prod(shape[:-1])], fp8kit/tensor.h), byte for byte: exact,
 * no scale read or written. For an FP8 tensor that arrives rowwise only
 * (an all-gathered weight) on a device whose FP8 GEMMs take the TN layout
 * only. tensor: E4M3 or E5M2 with per-tensor scaling (a block-scaled
 * copy has scales of its own: quantize it instead), data and
 * columnwise_data both set, on the same device. */
FP8KIT_API fp8kit_status fp8kit_columnwise_from_rowwise(fp8kit_tensor* tensor, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_QUANTIZE_H_ */
