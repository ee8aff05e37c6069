// fp8kit_grouped_quantize_block and fp8kit_grouped_block_scales_floats: the
// block-scaled grouped tensor in the padded row layout (fp8kit/grouped.h),
// each group quantized as a tensor of its own: on the CPU by the single
// tensor's reference, on CUDA by one launch of the single tensor's tiles
// over every group (common/cuda/quantize_block.cu).
#include <cstring>

#include "block_scale_layout.h"
#include "error.h"
#include "fp8kit/block_scaling.h"
#include "fp8kit/grouped.h"
#include "fp8kit/linear.h"
#include "grouped_layout.h"
#include "quantize_block_cpu.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

constexpr const char* kOp = "grouped_quantize_block";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void zero(const fp8kit_tensor& like, void* p, int64_t bytes, void* stream) {
  if (p == nullptr || bytes <= 0) return;
  if (like.device_type == FP8KIT_DEVICE_CPU) {
    std::memset(p, 0, size_t(bytes));
  } else {
#ifdef FP8KIT_WITH_CUDA
    cuda::zero_bytes(like.device_index, p, size_t(bytes), stream);
#endif
  }
  (void)stream;
}

char* at(void* base, int64_t bytes) {
  return base == nullptr ? nullptr : static_cast<char*>(base) + bytes;
}

float* at(float* base, int64_t floats) { return base == nullptr ? nullptr : base + floats; }

// The reference: each group through the single tensor's CPU quantization.
void quantize_groups_cpu(const fp8kit_tensor& input, const GroupLayout& layout,
                         const std::vector<int64_t>& row_scales,
                         const std::vector<int64_t>& col_scales, fp8kit_tensor& output,
                         const fp8kit_current_scaling_config& config) {
  const int64_t features = input.shape[1];
  const int64_t in_bytes = int64_t(fp8kit_dtype_size(input.dtype));
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t p = layout.padded(g), first = layout.column_starts[g];
    if (p == 0) continue;
    fp8kit_tensor in = input;
    in.shape[0] = p;
    in.data = at(input.data, first * features * in_bytes);
    fp8kit_tensor out = output;
    out.shape[0] = p;
    out.data = at(output.data, first * features);
    out.block_scale_inv = at(output.block_scale_inv, row_scales[g]);
    out.columnwise_data = at(output.columnwise_data, first * features);
    out.columnwise_block_scale_inv = at(output.columnwise_block_scale_inv, col_scales[g]);
    quantize_block_scaling_cpu(in, out, config);
  }
}

}  // namespace
}  // namespace fp8kit

extern "C" int64_t fp8kit_grouped_block_scales_floats(int64_t rows, int64_t groups,
                                                      int64_t features, fp8kit_scaling_mode mode,
                                                      int columnwise) {
  using fp8kit::ceil_div;
  using fp8kit::padded_inner;
  // Each group is [p, features] with p a multiple of 16 and the p's summing
  // to at most rows: a bound on the sum over groups of their scale arrays.
  const int64_t blocks = (rows + (FP8KIT_BLOCK_LEN - 1) * groups) / FP8KIT_BLOCK_LEN;
  const int64_t feature_blocks = ceil_div(features, FP8KIT_BLOCK_LEN);
  if (mode == FP8KIT_SCALING_BLOCK_1X128) {
    return columnwise ? padded_inner(features) * blocks : feature_blocks * rows;
  }
  // A group's columnwise scale rows are padded to the inner multiple.
  const int64_t padded_blocks = blocks + (FP8KIT_BLOCK_SCALE_INNER_MULTIPLE - 1) * groups;
  return columnwise ? feature_blocks * padded_blocks : padded_inner(feature_blocks) * blocks;
}

extern "C" fp8kit_status fp8kit_grouped_quantize_block(const fp8kit_tensor* input,
                                                       const fp8kit_tensor* group_sizes,
                                                       fp8kit_tensor* output,
                                                       const fp8kit_current_scaling_config* config,
                                                       void* stream) {
  using namespace fp8kit;
  return guard([&] {
    check_block_quantize_args(kOp, input, output);
    check_current_scaling_config(kOp, config);
    FP8KIT_CHECK(input->rank == 2 && input->shape[1] > 0, kOp, ": input has shape ",
                 shape_string(*input), "; it must be [rows, features] in the padded row layout");
    const int64_t rows = input->shape[0], features = input->shape[1];
    const GroupLayout layout = read_group_layout(kOp, group_sizes, rows, input->device_type,
                                                 input->device_index, stream, /*padded=*/true);
    const fp8kit_scaling_mode mode = output->scaling_mode;
    const std::vector<int64_t> row_scales = block_scale_offsets(layout, features, mode, false);
    const std::vector<int64_t> col_scales = block_scale_offsets(layout, features, mode, true);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      quantize_groups_cpu(*input, layout, row_scales, col_scales, *output, *config);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::grouped_quantize_block_scaling(*input, layout, row_scales, col_scales, *output,
                                           *config, stream);
#endif
    }
    // What the groups leave: the rows after the last group, and the scale
    // floats after the last group's (the buffers are defined throughout).
    const int64_t used = layout.column_starts[layout.groups()];
    zero(*input, at(output->data, used * features), (rows - used) * features, stream);
    zero(*input, at(output->columnwise_data, used * features), (rows - used) * features, stream);
    const int64_t e = layout.groups();
    zero(*input, at(output->block_scale_inv, row_scales[e]),
         (fp8kit_grouped_block_scales_floats(rows, e, features, mode, 0) - row_scales[e]) * 4,
         stream);
    zero(*input, at(output->columnwise_block_scale_inv, col_scales[e]),
         (fp8kit_grouped_block_scales_floats(rows, e, features, mode, 1) - col_scales[e]) * 4,
         stream);
  });
}
