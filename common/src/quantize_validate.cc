#include "quantize_validate.h"

#include <cmath>
#include <cstdint>

#include "block_scale_layout.h"
#include "error.h"
#include "validate.h"

namespace fp8kit {

void check_per_tensor_mode(const char* op, const char* arg, const fp8kit_tensor& t) {
  switch (t.scaling_mode) {
    case FP8KIT_SCALING_PER_TENSOR: return;
    case FP8KIT_SCALING_NONE:
      fail(FP8KIT_INVALID_ARGUMENT, op, ": ", arg,
           " has scaling_mode FP8KIT_SCALING_NONE; an FP8 tensor needs "
           "FP8KIT_SCALING_PER_TENSOR with its scale pointers");
    case FP8KIT_SCALING_BLOCK_1X128:
    case FP8KIT_SCALING_BLOCK_128X128:
      fail(FP8KIT_INVALID_ARGUMENT, op, ": ", arg, " has block scaling (",
           scaling_mode_name(t.scaling_mode), ") but ", op,
           " takes per-tensor scaling only (FP8KIT_SCALING_PER_TENSOR); block-scaled "
           "tensors are made by fp8kit_quantize_block_scaling");
  }
  fail(FP8KIT_INVALID_ARGUMENT, op, ": ", arg, " has unknown scaling_mode ",
       int(t.scaling_mode), "; use FP8KIT_SCALING_PER_TENSOR");
}

const char* scaling_mode_name(fp8kit_scaling_mode mode) {
  switch (mode) {
    case FP8KIT_SCALING_NONE: return "FP8KIT_SCALING_NONE";
    case FP8KIT_SCALING_PER_TENSOR: return "FP8KIT_SCALING_PER_TENSOR";
    case FP8KIT_SCALING_BLOCK_1X128: return "FP8KIT_SCALING_BLOCK_1X128";
    case FP8KIT_SCALING_BLOCK_128X128: return "FP8KIT_SCALING_BLOCK_128X128";
  }
  return "an unknown scaling_mode";
}

void check_block_mode(const char* op, const char* arg, const fp8kit_tensor& t) {
  FP8KIT_CHECK(is_block_scaling(t.scaling_mode), op, ": ", arg, " has ",
               scaling_mode_name(t.scaling_mode), " (", int(t.scaling_mode),
               "); use FP8KIT_SCALING_BLOCK_1X128 (activations, gradients) or "
               "FP8KIT_SCALING_BLOCK_128X128 (weights)");
}

void check_block_scales_aligned(const char* op, const char* arg, const char* field,
                                const float* p) {
  FP8KIT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, op, ": ", arg, "->", field, " (", p,
               ") is not 16-byte aligned; cuBLASLt reads block scales with 16-byte accesses, "
               "so give the scales an allocation of their own");
}

void check_block_quantize_args(const char* op, const fp8kit_tensor* input,
                               const fp8kit_tensor* output) {
  check_tensor(op, "input", input);
  check_high_precision(op, "input", *input);
  check_element_aligned(op, "input", *input);
  check_tensor(op, "output", output, /*allow_null_data=*/true);
  check_fp8(op, "output", *output);
  check_block_mode(op, "output", *output);
  check_same_device(op, "input", *input, "output", *output);
  check_same_shape(op, "input", *input, "output", *output);
  FP8KIT_CHECK(output->scale == nullptr && output->scale_inv == nullptr &&
                   output->amax == nullptr,
               op, ": output has a per-tensor scale, scale_inv or amax pointer, but a "
               "block-scaled tensor keeps its scales in block_scale_inv and "
               "columnwise_block_scale_inv only; set scale, scale_inv and amax to NULL");
  FP8KIT_CHECK((output->data == nullptr) == (output->block_scale_inv == nullptr), op,
               output->data ? ": output->data is set but output->block_scale_inv is NULL"
                            : ": output->block_scale_inv is set but output->data is NULL",
               "; the rowwise copy and its scales go together (fp8kit_block_scale_inv_shape "
               "gives the scales' size)");
  FP8KIT_CHECK((output->columnwise_data == nullptr) ==
                   (output->columnwise_block_scale_inv == nullptr),
               op,
               output->columnwise_data
                   ? ": output->columnwise_data is set but output->columnwise_block_scale_inv "
                     "is NULL"
                   : ": output->columnwise_block_scale_inv is set but output->columnwise_data "
                     "is NULL",
               "; the columnwise copy and its scales go together (fp8kit_block_scale_inv_shape "
               "gives the scales' size)");
  FP8KIT_CHECK(fp8kit_tensor_numel(output) == 0 || output->data != nullptr ||
                   output->columnwise_data != nullptr,
               op, ": output has neither data nor columnwise_data; set at least one of them "
               "(data for the rowwise copy, columnwise_data for the transposed copy), each "
               "with its block scales");
  check_block_scales_aligned(op, "output", "block_scale_inv", output->block_scale_inv);
  check_block_scales_aligned(op, "output", "columnwise_block_scale_inv",
                             output->columnwise_block_scale_inv);
}

void check_element_aligned(const char* op, const char* arg, const fp8kit_tensor& t) {
  const size_t size = fp8kit_dtype_size(t.dtype);
  FP8KIT_CHECK(size == 0 || reinterpret_cast<uintptr_t>(t.data) % size == 0, op, ": ", arg,
               "->data is not aligned to its element size (", size, " bytes for ",
               fp8kit_dtype_name(t.dtype), "); pass a pointer to the start of an element");
}

void check_quantize_args(const char* op, const fp8kit_tensor* input, const fp8kit_tensor* output,
                         bool current_scaling) {
  check_tensor(op, "input", input);
  check_high_precision(op, "input", *input);
  check_element_aligned(op, "input", *input);
  check_tensor(op, "output", output, /*allow_null_data=*/true);
  check_fp8(op, "output", *output);
  check_per_tensor_mode(op, "output", *output);
  check_same_device(op, "input", *input, "output", *output);
  check_same_shape(op, "input", *input, "output", *output);
  // An empty tensor has nothing to write, and frameworks hand out NULL data
  // pointers for empty storage, so only tensors with elements need one.
  FP8KIT_CHECK(fp8kit_tensor_numel(output) == 0 || output->data != nullptr ||
                   output->columnwise_data != nullptr,
               op, ": output has neither data nor columnwise_data; set at least one of them "
               "(data for the rowwise copy, columnwise_data for the transposed copy)");
  FP8KIT_CHECK(output->scale != nullptr, op,
               current_scaling ? ": output->scale is NULL; current scaling writes the scale it "
                                 "computes there, so pass a buffer of 1 float"
                               : ": output->scale is NULL; delayed-scaling quantize reads the "
                                 "scale from there (or use fp8kit_quantize_current_scaling)");
  if (current_scaling) {
    FP8KIT_CHECK(output->scale_inv != nullptr, op,
                 ": output->scale_inv is NULL; current scaling writes 1/scale there, so pass "
                 "a buffer of 1 float");
    FP8KIT_CHECK(output->amax != nullptr, op,
                 ": output->amax is NULL; current scaling writes the input's amax there, so "
                 "pass a buffer of 1 float");
  }
}

void check_delayed_scaling_config(const char* op, const fp8kit_delayed_scaling_config* config) {
  FP8KIT_CHECK(config != nullptr, op, ": config is NULL; pass a fp8kit_delayed_scaling_config");
  FP8KIT_CHECK(config->amax_history_len >= 1 &&
                   config->amax_history_len <= FP8KIT_AMAX_HISTORY_LEN_MAX,
               op, ": config->amax_history_len is ", config->amax_history_len,
               "; it must be in [1, ",
               FP8KIT_AMAX_HISTORY_LEN_MAX, "] (FP8KIT_AMAX_HISTORY_LEN_MAX; 1 keeps only the "
               "newest amax)");
  FP8KIT_CHECK(config->amax_reduction == FP8KIT_AMAX_MAX ||
                   config->amax_reduction == FP8KIT_AMAX_MOST_RECENT,
               op, ": config->amax_reduction is ", int(config->amax_reduction),
               "; use FP8KIT_AMAX_MAX or FP8KIT_AMAX_MOST_RECENT");
  FP8KIT_CHECK(config->margin >= 0 && config->margin <= FP8KIT_MARGIN_MAX, op,
               ": config->margin is ", config->margin, "; it must be in [0, ", FP8KIT_MARGIN_MAX,
               "] (FP8KIT_MARGIN_MAX; scale = fp8_max / amax / 2**margin)");
}

void check_delayed_quantize_state(const char* op, const char* arg,
                                  const fp8kit_delayed_quantize_state& s,
                                  const fp8kit_delayed_scaling_config& config) {
  FP8KIT_CHECK(s.amax_history != nullptr && s.amax != nullptr && s.scale != nullptr &&
                   s.scale_inv != nullptr && s.counter != nullptr,
               op, ": ", arg, " has a NULL pointer; amax_history, amax, scale, scale_inv and "
               "counter are all required (seeded may be NULL)");
  FP8KIT_CHECK(s.amax < s.amax_history || s.amax >= s.amax_history + config.amax_history_len, op,
               ": ", arg, ".amax points into its amax_history; the amax accumulator needs a "
               "float of its own");
}

void check_current_scaling_config(const char* op, const fp8kit_current_scaling_config* config) {
  FP8KIT_CHECK(config != nullptr, op,
               ": config is NULL; pass a fp8kit_current_scaling_config (amax_epsilon = 0 "
               "and power_2_scale = 0 for plain current scaling)");
  FP8KIT_CHECK(std::isfinite(config->amax_epsilon) && config->amax_epsilon >= 0.0f, op,
               ": config->amax_epsilon is ", config->amax_epsilon,
               "; it must be a finite number >= 0 (0 disables it)");
}

void check_dequantize_args(const fp8kit_tensor* input, const fp8kit_tensor* output,
                           int from_columnwise) {
  const char* op = "dequantize";
  check_tensor(op, "input", input, /*allow_null_data=*/true);
  check_fp8(op, "input", *input);
  const bool block = is_block_scaling(input->scaling_mode);
  if (!block) check_per_tensor_mode(op, "input", *input);
  check_tensor(op, "output", output);
  check_high_precision(op, "output", *output);
  check_element_aligned(op, "output", *output);
  check_same_device(op, "input", *input, "output", *output);
  check_same_shape(op, "input", *input, "output", *output);
  if (block) {
    const char* field = from_columnwise ? "columnwise_block_scale_inv" : "block_scale_inv";
    const float* scales =
        from_columnwise ? input->columnwise_block_scale_inv : input->block_scale_inv;
    FP8KIT_CHECK(fp8kit_tensor_numel(input) == 0 || scales != nullptr, op, ": input->", field,
                 " is NULL; a block-scaled tensor is dequantized with the scales of the copy "
                 "it is read from");
    check_block_scales_aligned(op, "input", field, scales);
  } else {
    FP8KIT_CHECK(input->scale_inv != nullptr, op,
                 ": input->scale_inv is NULL; dequantize multiplies by it, so pass the "
                 "tensor's scale_inv");
  }
  if (fp8kit_tensor_numel(input) > 0) {
    if (from_columnwise) {
      FP8KIT_CHECK(input->columnwise_data != nullptr, op,
                   ": from_columnwise is set but input->columnwise_data is NULL; quantize with "
                   "a columnwise output or dequantize the rowwise data (from_columnwise = 0)");
    } else {
      FP8KIT_CHECK(input->data != nullptr, op,
                   ": input->data (rowwise) is NULL; pass from_columnwise = 1 to read the "
                   "columnwise copy instead");
    }
  }
}

}  // namespace fp8kit
