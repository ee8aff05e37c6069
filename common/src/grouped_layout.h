// Where each group of a token-grouped tensor lies (fp8kit/grouped.h): the
// group sizes read to the host, checked, and the offsets every grouped op
// derives from them, computed once here for the CPU and CUDA paths alike.
#ifndef FP8KIT_SRC_GROUPED_LAYOUT_H_
#define FP8KIT_SRC_GROUPED_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "fp8kit/grouped.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

constexpr int kMaxGroups = FP8KIT_MAX_GROUPS;

struct GroupLayout {
  std::vector<int64_t> sizes;          // m_g
  std::vector<int64_t> starts;         // first row of group g; starts[E] = T
  std::vector<int64_t> column_starts;  // first column of group g's block in
                                       // the grouped columnwise copy;
                                       // column_starts[E] = sum of p_g
  int64_t tokens = 0;                  // T, the real rows (sum of m_g)
  int64_t column_tokens = 0;           // fp8kit_grouped_columnwise_tokens(T, E)

  int64_t groups() const { return static_cast<int64_t>(sizes.size()); }
  // p_g: m_g rounded up to FP8KIT_GEMM_DIM_MULTIPLE.
  int64_t padded(int64_t g) const { return column_starts[g + 1] - column_starts[g]; }
};

// Reads `group_sizes` (an int64 tensor [E], 1 <= E <= kMaxGroups, on the CPU
// or on `device_index`'s CUDA device: then one copy to the host and a wait
// on `stream`) and checks that the sizes are >= 0 and sum to `rows` (the
// contiguous layout) or, with `padded` (the padded row layout of
// block-scaled tensors), that the padded groups fit in `rows`. Errors name
// `op` and the argument.
GroupLayout read_group_layout(const char* op, const fp8kit_tensor* group_sizes, int64_t rows,
                              fp8kit_device_type device_type, int device_index, void* stream,
                              bool padded = false);

// Where each group's block scales start in a copy's scale array (floats,
// [E + 1]; the last entry the total), for group g a tensor [p_g, features]
// scaled in `mode`, its rowwise or columnwise copy (fp8kit/grouped.h).
std::vector<int64_t> block_scale_offsets(const GroupLayout& layout, int64_t features,
                                         fp8kit_scaling_mode mode, bool columnwise);

// The floats of the block scales of one [rows, cols] tensor's copy.
int64_t block_scales_floats(int64_t rows, int64_t cols, fp8kit_scaling_mode mode,
                            bool columnwise);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_GROUPED_LAYOUT_H_
