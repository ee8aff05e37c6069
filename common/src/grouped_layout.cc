#include "grouped_layout.h"

#include "error.h"
#include "fp8kit/block_scaling.h"
#include "fp8kit/grouped.h"
#include "fp8kit/linear.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" int64_t fp8kit_grouped_columnwise_tokens(int64_t tokens, int64_t groups) {
  return tokens + (FP8KIT_GEMM_DIM_MULTIPLE - 1) * groups;
}

extern "C" fp8kit_status fp8kit_grouped_check_sizes(const fp8kit_tensor* group_sizes,
                                                    int64_t tokens, void* stream) {
  return fp8kit::guard([&] {
    constexpr const char* kOp = "grouped_check_sizes";
    FP8KIT_CHECK(group_sizes != nullptr, kOp, ": group_sizes is NULL");
    FP8KIT_CHECK(tokens >= 0, kOp, ": tokens is ", tokens, "; it must be >= 0");
    fp8kit::read_group_layout(kOp, group_sizes, tokens, group_sizes->device_type,
                              group_sizes->device_index, stream);
  });
}

namespace fp8kit {

GroupLayout read_group_layout(const char* op, const fp8kit_tensor* group_sizes, int64_t rows,
                              fp8kit_device_type device_type, int device_index, void* stream,
                              bool padded) {
  check_tensor(op, "group_sizes", group_sizes, /*allow_null_data=*/true);
  const fp8kit_tensor& gs = *group_sizes;
  FP8KIT_CHECK(gs.dtype == FP8KIT_INT64, op, ": group_sizes has dtype ",
               fp8kit_dtype_name(gs.dtype), "; the group sizes are int64 counts");
  FP8KIT_CHECK(gs.rank == 1 && gs.shape[0] >= 1 && gs.shape[0] <= kMaxGroups, op,
               ": group_sizes has shape ", shape_string(gs), "; it must be [E], one int64 count "
               "per group, with 1 <= E <= ", kMaxGroups);
  FP8KIT_CHECK(gs.data != nullptr, op, ": group_sizes has no data");
  const bool on_host = gs.device_type == FP8KIT_DEVICE_CPU;
  FP8KIT_CHECK(on_host || (gs.device_type == device_type && gs.device_index == device_index), op,
               ": group_sizes is on CUDA device ", gs.device_index,
               " but the op runs on another device; pass the sizes on the CPU or on the op's "
               "device");
  GroupLayout layout;
  const int64_t groups = gs.shape[0];
  layout.sizes.resize(groups);
  if (on_host) {
    const auto* sizes = static_cast<const int64_t*>(gs.data);
    layout.sizes.assign(sizes, sizes + groups);
  } else {
#ifdef FP8KIT_WITH_CUDA
    cuda::copy_to_host(device_index, layout.sizes.data(), gs.data,
                       static_cast<size_t>(groups) * sizeof(int64_t), stream);
#endif
  }
  (void)stream;
  layout.starts.assign(groups + 1, 0);
  layout.column_starts.assign(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m = layout.sizes[g];
    FP8KIT_CHECK(m >= 0 && m <= rows, op, ": group_sizes[", g, "] is ", m,
                 "; every group size must be in [0, ", rows, "] (the input's rows)");
    const int64_t p = (m + FP8KIT_GEMM_DIM_MULTIPLE - 1) / FP8KIT_GEMM_DIM_MULTIPLE *
                      FP8KIT_GEMM_DIM_MULTIPLE;
    layout.starts[g + 1] = layout.starts[g] + m;
    layout.column_starts[g + 1] = layout.column_starts[g] + p;
    if (padded) {
      FP8KIT_CHECK(layout.column_starts[g + 1] <= rows, op, ": group_sizes[0..", g,
                   "], each padded to ", FP8KIT_GEMM_DIM_MULTIPLE, " rows, take ",
                   layout.column_starts[g + 1], " rows but the input has ", rows,
                   "; a padded grouped tensor needs room for every group's padding");
    } else {
      FP8KIT_CHECK(layout.starts[g + 1] <= rows, op, ": group_sizes sum to more than the ",
                   rows, " rows of the input; the sizes must sum to the rows exactly");
    }
  }
  FP8KIT_CHECK(padded || layout.starts[groups] == rows, op, ": group_sizes sum to ",
               layout.starts[groups], " but the input has ", rows,
               " rows; the sizes must sum to the rows exactly (sort the tokens by group and "
               "count every one)");
  layout.tokens = layout.starts[groups];
  layout.column_tokens = fp8kit_grouped_columnwise_tokens(layout.tokens, groups);
  return layout;
}

int64_t block_scales_floats(int64_t rows, int64_t cols, fp8kit_scaling_mode mode,
                            bool columnwise) {
  fp8kit_tensor t{};
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.scaling_mode = mode;
  int64_t shape[2] = {0, 0};
  FP8KIT_CHECK(fp8kit_block_scale_inv_shape(&t, columnwise ? 1 : 0, shape) == FP8KIT_OK,
               "block scales of a [", rows, ", ", cols, "] tensor: ", fp8kit_last_error());
  return shape[0] * shape[1];
}

std::vector<int64_t> block_scale_offsets(const GroupLayout& layout, int64_t features,
                                         fp8kit_scaling_mode mode, bool columnwise) {
  std::vector<int64_t> offsets(layout.groups() + 1, 0);
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t p = layout.padded(g);
    offsets[g + 1] = offsets[g] + (p == 0 ? 0 : block_scales_floats(p, features, mode,
                                                                      columnwise));
  }
  return offsets;
}

}  // namespace fp8kit
