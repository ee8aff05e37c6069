// fp8kit_grouped_quantize: validation, then the CPU reference (here: each
// group through the per-tensor quantization of quantize_cpu.h, so the two
// agree by construction) or the CUDA kernels.
#include <cstring>
#include <vector>

#include "amax_cpu.h"
#include "compute_scale.h"
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

void check_args(const fp8kit_tensor* input, const fp8kit_tensor* output,
                const fp8kit_current_scaling_config* current) {
  check_tensor(kOp, "input", input);
  check_high_precision(kOp, "input", *input);
  check_element_aligned(kOp, "input", *input);
  FP8KIT_CHECK(input->rank == 2 && input->shape[1] > 0 &&
                   input->shape[1] % FP8KIT_GEMM_DIM_MULTIPLE == 0,
               kOp, ": input has shape ", shape_string(*input), "; it must be [tokens, features] "
               "with features a positive multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
               " (the GEMMs' alignment)");
  check_tensor(kOp, "output", output, /*allow_null_data=*/true);
  check_fp8(kOp, "output", *output);
  check_per_tensor_mode(kOp, "output", *output);
  check_same_device(kOp, "input", *input, "output", *output);
  check_same_shape(kOp, "input", *input, "output", *output);
  FP8KIT_CHECK(output->data != nullptr || output->columnwise_data != nullptr, kOp,
               ": output has neither data nor columnwise_data; set at least one of them");
  FP8KIT_CHECK(output->scale != nullptr && output->scale_inv != nullptr, kOp,
               ": output->scale and output->scale_inv must both be set, each to E * "
               "FP8KIT_GROUP_SCALE_STRIDE floats (one group's scale every 16 bytes)");
  if (current != nullptr) {
    check_current_scaling_config(kOp, current);
    FP8KIT_CHECK(output->amax != nullptr, kOp, ": output->amax is NULL; current scaling writes "
                 "each group's amax there (E * FP8KIT_GROUP_SCALE_STRIDE floats)");
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

void grouped_quantize_cpu(const fp8kit_tensor& input, const GroupLayout& layout,
                          fp8kit_tensor& output, const fp8kit_current_scaling_config* current) {
  const int64_t features = input.shape[1];
  auto* data = static_cast<uint8_t*>(output.data);
  auto* columnwise = static_cast<uint8_t*>(output.columnwise_data);
  if (columnwise != nullptr) std::memset(columnwise, 0, size_t(features * layout.column_tokens));
  std::vector<uint8_t> transposed;
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const fp8kit_tensor rows = group_rows(input, layout, g);
    const int64_t s = g * FP8KIT_GROUP_SCALE_STRIDE;
    float scale = checked_scale(output.scale[s]);
    if (current != nullptr) {
      const float amax = amax_cpu(rows);
      scale = current_scale_from_amax(amax, fp8kit_fp8_max(output.dtype), current->amax_epsilon,
                                      current->power_2_scale != 0);
      output.scale[s] = scale;
    }
    const int64_t m = layout.sizes[g];
    transposed.resize(size_t(features * m));
    const float amax = quantize_cpu(rows, scale, output.dtype,
                                    data ? data + layout.starts[g] * features : nullptr,
                                    columnwise ? transposed.data() : nullptr);
    if (output.amax != nullptr) output.amax[s] = amax;
    output.scale_inv[s] = reciprocal(scale);
    if (columnwise == nullptr) continue;
    // Group g's block: [features, p_g], its m real columns first.
    uint8_t* block = columnwise + features * layout.column_starts[g];
    for (int64_t c = 0; c < features; ++c) {
      std::memcpy(block + c * layout.padded(g), transposed.data() + c * m, size_t(m));
    }
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
