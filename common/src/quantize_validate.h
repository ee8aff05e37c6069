// Argument checks of quantize, current-scaling quantize, compute_scale and
// dequantize, run before the CPU or CUDA path so both accept exactly the
// same inputs. Each throws fp8kit::Error naming the op, the argument and
// the fix.
#ifndef FP8KIT_SRC_QUANTIZE_VALIDATE_H_
#define FP8KIT_SRC_QUANTIZE_VALIDATE_H_

#include "fp8kit/delayed_scaling.h"
#include "fp8kit/quantize.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// The output descriptor of a per-tensor quantize: FP8 dtype, PER_TENSOR
// scaling mode, same shape and device as `input`, at least one of data /
// columnwise_data when there are elements, and the scale pointers `op`
// needs (scale always; scale_inv and amax too when `current_scaling`).
void check_quantize_args(const char* op, const fp8kit_tensor* input, const fp8kit_tensor* output,
                         bool current_scaling);

// amax_history_len and margin within the ranges of fp8kit/delayed_scaling.h
// (FP8KIT_AMAX_HISTORY_LEN_MAX, FP8KIT_MARGIN_MAX), a known reduction.
void check_delayed_scaling_config(const char* op, const fp8kit_delayed_scaling_config* config);

// One slot's fp8kit_delayed_quantize_state (named `arg` in messages): every
// pointer but `seeded` set, the accumulator outside the history.
void check_delayed_quantize_state(const char* op, const char* arg,
                                  const fp8kit_delayed_quantize_state& state,
                                  const fp8kit_delayed_scaling_config& config);

// amax_epsilon finite and >= 0.
void check_current_scaling_config(const char* op, const fp8kit_current_scaling_config* config);

// input: FP8, per-tensor with scale_inv or block-scaled with the scales of
// the copy selected by from_columnwise, and that copy's data; output:
// float32/bfloat16/float16 of the same shape and device.
void check_dequantize_args(const fp8kit_tensor* input, const fp8kit_tensor* output,
                           int from_columnwise);

// t.data is aligned to its element size (a float32/bf16/fp16 pointer at an
// odd address would fault in the CUDA kernels).
void check_element_aligned(const char* op, const char* arg, const fp8kit_tensor& t);

// scaling_mode must be PER_TENSOR.
void check_per_tensor_mode(const char* op, const char* arg, const fp8kit_tensor& t);

// "FP8KIT_SCALING_BLOCK_1X128" etc., for messages.
const char* scaling_mode_name(fp8kit_scaling_mode mode);

// scaling_mode must be BLOCK_1X128 or BLOCK_128X128.
void check_block_mode(const char* op, const char* arg, const fp8kit_tensor& t);

// A block-scale array (`arg`->`field`) is 16-byte aligned (NULL passes).
void check_block_scales_aligned(const char* op, const char* arg, const char* field,
                                const float* p);

// The output descriptor of a block-scaled quantize: FP8 dtype, a block
// scaling mode, same shape and device as `input`, each copy with its
// scales (at least one copy when there are elements), no per-tensor scale
// pointers.
void check_block_quantize_args(const char* op, const fp8kit_tensor* input,
                               const fp8kit_tensor* output);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_QUANTIZE_VALIDATE_H_
