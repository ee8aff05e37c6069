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
  int64_t tokens = 0;                  // T
  int64_t column_tokens = 0;           // fp8kit_grouped_columnwise_tokens(T, E)

  int64_t groups() const { return static_cast<int64_t>(sizes.size()); }
  // p_g: m_g rounded up to FP8KIT_GEMM_DIM_MULTIPLE.
  int64_t padded(int64_t g) const { return column_starts[g + 1] - column_starts[g]; }
};

// Reads `group_sizes` (an int64 tensor [E], 1 <= E <= kMaxGroups, on the CPU
// or on `device_index`'s CUDA device: then one copy to the host and a wait
// on `stream`) and checks that the sizes are >= 0 and sum to `tokens`.
// Errors name `op` and the argument.
GroupLayout read_group_layout(const char* op, const fp8kit_tensor* group_sizes, int64_t tokens,
                              fp8kit_device_type device_type, int device_index, void* stream);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_GROUPED_LAYOUT_H_
