// fp8kit_grouped_quantize and fp8kit_grouped_quantize_delayed_update:
// validation, then the CPU reference (here: each group through the
// per-tensor quantization of quantize_cpu.h and the delayed-scaling update
// of delayed_scaling_cpu.h, so the grouped ops agree with the single-tensor
// ones by construction) or the CUDA kernels.
#include <cstdint>
#include <cstring>
#include <vector>

#include "amax_cpu.h"
#include "compute_scale.h"
#include "delayed_scaling_cpu.h"
#include "error.h"
#include "fp8kit/grouped.h"
#include "fp8kit/linear.h"
#include "grouped_layout.h"
#include "quantize_cpu.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

constexpr const char* kOp = "grouped_quantize";
constexpr const char* kDelayedOp = "grouped_quantize_delayed_update";
constexpr int64_t kStride = FP8KIT_GROUP_SCALE_STRIDE;

// The input and output checks both ops share (`op` names the op).
void check_io(const char* op, const fp8kit_tensor* input, const fp8kit_tensor* output) {
  check_tensor(op, "input", input);
  check_high_precision(op, "input", *input);
  check_element_aligned(op, "input", *input);
  FP8KIT_CHECK(input->rank == 2 && input->shape[1] > 0 &&
                   input->shape[1] % FP8KIT_GEMM_DIM_MULTIPLE == 0,
               op, ": input has shape ", shape_string(*input), "; it must be [tokens, features] "
               "with features a positive multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
               " (the GEMMs' alignment)");
  check_tensor(op, "output", output, /*allow_null_data=*/true);
  check_fp8(op, "output", *output);
  check_per_tensor_mode(op, "output", *output);
  check_same_device(op, "input", *input, "output", *output);
  check_same_shape(op, "input", *input, "output", *output);
  FP8KIT_CHECK(output->data != nullptr || output->columnwise_data != nullptr, op,
               ": output has neither data nor columnwise_data; set at least one of them");
  FP8KIT_CHECK(output->scale != nullptr && output->scale_inv != nullptr, op,
               ": output->scale and output->scale_inv must both be set, each to E * "
               "FP8KIT_GROUP_SCALE_STRIDE floats (one group's scale every 16 bytes)");
}

void check_args(const fp8kit_tensor* input, const fp8kit_tensor* output,
                const fp8kit_current_scaling_config* current) {
  check_io(kOp, input, output);
  if (current != nullptr) {
    check_current_scaling_config(kOp, current);
    FP8KIT_CHECK(output->amax != nullptr, kOp, ": output->amax is NULL; current scaling writes "
                 "each group's amax there (E * FP8KIT_GROUP_SCALE_STRIDE floats)");
  }
}

// An array of `count` floats, for the overlap check (NULL: none).
struct Span {
  const char* name;
  const float* p;
  int64_t count;
  bool overlaps(const Span& o) const {
    if (p == nullptr || o.p == nullptr) return false;
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(o.p);
    return a < b + uintptr_t(o.count) * sizeof(float) && b < a + uintptr_t(count) * sizeof(float);
  }
};

// The delayed op's extra checks, once the group count is known: the state
// set and no two of the arrays overlapping (the CUDA kernels read one while
// writing another).
void check_delayed_args(const fp8kit_tensor& output, const fp8kit_grouped_delayed_state* state,
                        const fp8kit_delayed_scaling_config& config, int64_t groups) {
  FP8KIT_CHECK(output.amax != nullptr, kDelayedOp, ": output->amax is NULL; the op writes each "
               "group's amax there (E * FP8KIT_GROUP_SCALE_STRIDE floats)");
  FP8KIT_CHECK(state != nullptr && state->amax_history != nullptr && state->scale != nullptr,
               kDelayedOp, ": state, state->amax_history and state->scale are required "
               "(state->seeded may be NULL)");
  const int64_t scales = groups * kStride;
  const Span spans[] = {{"state->amax_history", state->amax_history,
                         groups * config.amax_history_len},
                        {"state->scale", state->scale, scales},
                        {"state->seeded", state->seeded, scales},
                        {"output->scale", output.scale, scales},
                        {"output->scale_inv", output.scale_inv, scales},
                        {"output->amax", output.amax, scales}};
  for (size_t i = 0; i < sizeof(spans) / sizeof(spans[0]); ++i) {
    for (size_t j = 0; j < i; ++j) {
      FP8KIT_CHECK(!spans[i].overlaps(spans[j]), kDelayedOp, ": ", spans[j].name, " and ",
                   spans[i].name, " overlap; each needs a buffer of its own");
    }
  }
}

// Group g's rows of `input` as a tensor of their own.
fp8kit_tensor group_rows(const fp8kit_tensor& input, const GroupLayout& layout, int64_t g) {
  fp8kit_tensor rows = input;
  rows.shape[0] = layout.sizes[g];
  rows.data = static_cast<char*>(input.data) +
              layout.starts[g] * input.shape[1] * fp8kit_dtype_size(input.dtype);
  return rows;
}

// Zeroes the grouped columnwise copy (its padding columns and tail stay so).
void clear_columnwise(const fp8kit_tensor& input, const GroupLayout& layout,
                      fp8kit_tensor& output) {
  if (output.columnwise_data == nullptr) return;
  std::memset(output.columnwise_data, 0, size_t(input.shape[1] * layout.column_tokens));
}

// Casts group g's rows with `scale` (already through checked_scale) into
// output's rowwise data and its block of the cleared columnwise copy;
// returns their amax (quantize_cpu's). `transposed` is scratch.
float cast_group(const fp8kit_tensor& input, const GroupLayout& layout, int64_t g, float scale,
                 fp8kit_tensor& output, std::vector<uint8_t>& transposed) {
  const int64_t features = input.shape[1], m = layout.sizes[g];
  auto* data = static_cast<uint8_t*>(output.data);
  auto* columnwise = static_cast<uint8_t*>(output.columnwise_data);
  transposed.resize(size_t(features * m));
  const float amax = quantize_cpu(group_rows(input, layout, g), scale, output.dtype,
                                  data ? data + layout.starts[g] * features : nullptr,
                                  columnwise ? transposed.data() : nullptr);
  if (columnwise == nullptr) return amax;
  // Group g's block: [features, p_g], its m real columns first.
  uint8_t* block = columnwise + features * layout.column_starts[g];
  for (int64_t c = 0; c < features; ++c) {
    std::memcpy(block + c * layout.padded(g), transposed.data() + c * m, size_t(m));
  }
  return amax;
}

void grouped_quantize_cpu(const fp8kit_tensor& input, const GroupLayout& layout,
                          fp8kit_tensor& output, const fp8kit_current_scaling_config* current) {
  clear_columnwise(input, layout, output);
  std::vector<uint8_t> transposed;
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t s = g * kStride;
    float scale = checked_scale(output.scale[s]);
    if (current != nullptr) {
      scale = current_scale_from_amax(amax_cpu(group_rows(input, layout, g)),
                                      fp8kit_fp8_max(output.dtype), current->amax_epsilon,
                                      current->power_2_scale != 0);
      output.scale[s] = scale;
    }
    const float amax = cast_group(input, layout, g, scale, output, transposed);
    if (output.amax != nullptr) output.amax[s] = amax;
    output.scale_inv[s] = reciprocal(scale);
  }
}

// Step by step what quantize_delayed_update_cpu does for one tensor whose
// accumulator is 0, with group g's rows and state.
void grouped_quantize_delayed_cpu(const fp8kit_tensor& input, const GroupLayout& layout,
                                  fp8kit_tensor& output, const fp8kit_grouped_delayed_state& st,
                                  const fp8kit_delayed_scaling_config& config, bool record) {
  clear_columnwise(input, layout, output);
  const float fp8_max = fp8kit_fp8_max(output.dtype);
  std::vector<uint8_t> transposed;
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t s = g * kStride;
    float* scale = st.scale + s;
    const bool fresh = st.seeded != nullptr && st.seeded[s] == 0.0f;
    const float used = checked_scale(
        fresh ? delayed_scale_from_amax(amax_cpu(group_rows(input, layout, g)), *scale, fp8_max,
                                        config.margin)
              : *scale);
    // quantize_cpu's NaN is the canonical one, as the accumulator holds it.
    const float amax = cast_group(input, layout, g, used, output, transposed);
    output.scale[s] = used;
    output.scale_inv[s] = reciprocal(used);
    output.amax[s] = amax;
    if (!record) continue;
    *scale = used;  // the previous scale of the update: the one used
    float new_scale_inv;  // the state keeps none: each cast writes its own
    const fp8kit_delayed_scaling_state update{st.amax_history + g * config.amax_history_len,
                                              &amax, scale, &new_scale_inv, output.dtype};
    delayed_scaling_update_cpu(&update, 1, config);
    if (st.seeded != nullptr) st.seeded[s] = 1.0f;
  }
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_grouped_quantize(const fp8kit_tensor* input,
                                                 const fp8kit_tensor* group_sizes,
                                                 fp8kit_tensor* output,
                                                 const fp8kit_current_scaling_config* current,
                                                 void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_args(input, output, current);
    const fp8kit::GroupLayout layout =
        fp8kit::read_group_layout(fp8kit::kOp, group_sizes, input->shape[0], input->device_type,
                                  input->device_index, stream);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::grouped_quantize_cpu(*input, layout, *output, current);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::grouped_quantize(*input, layout, *output, current, stream);
#endif
    }
  });
}

extern "C" fp8kit_status fp8kit_grouped_quantize_delayed_update(
    const fp8kit_tensor* input, const fp8kit_tensor* group_sizes, fp8kit_tensor* output,
    const fp8kit_grouped_delayed_state* state, const fp8kit_delayed_scaling_config* config,
    int record, void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_io(fp8kit::kDelayedOp, input, output);
    fp8kit::check_delayed_scaling_config(fp8kit::kDelayedOp, config);
    const fp8kit::GroupLayout layout =
        fp8kit::read_group_layout(fp8kit::kDelayedOp, group_sizes, input->shape[0],
                                  input->device_type, input->device_index, stream);
    fp8kit::check_delayed_args(*output, state, *config, layout.groups());
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::grouped_quantize_delayed_cpu(*input, layout, *output, *state, *config,
                                           record != 0);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::grouped_quantize_delayed_update(*input, layout, *output, *state, *config,
                                                    record != 0, stream);
#endif
    }
  });
}
