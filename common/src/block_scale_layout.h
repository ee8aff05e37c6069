// Where each block's scale_inv lives (the layout of fp8kit/block_scaling.h),
// host and device inline, shared by the CPU reference, the CUDA kernels,
// the GEMM's checks and fp8kit_block_scale_inv_shape, so the rule is
// written once.
#ifndef FP8KIT_SRC_BLOCK_SCALE_LAYOUT_H_
#define FP8KIT_SRC_BLOCK_SCALE_LAYOUT_H_

#include <cstdint>

#include "float_bits.h"
#include "fp8kit/block_scaling.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

constexpr int64_t kBlockLen = FP8KIT_BLOCK_LEN;

FP8KIT_HD bool is_block_scaling(fp8kit_scaling_mode mode) {
  return mode == FP8KIT_SCALING_BLOCK_1X128 || mode == FP8KIT_SCALING_BLOCK_128X128;
}

FP8KIT_HD int64_t blocks_along(int64_t n) { return (n + kBlockLen - 1) / kBlockLen; }
// n rounded up to the scale arrays' inner multiple.
FP8KIT_HD int64_t padded_inner(int64_t n) {
  constexpr int64_t m = FP8KIT_BLOCK_SCALE_INNER_MULTIPLE;
  return (n + m - 1) / m * m;
}

// The scale array [outer, inner] of one stored copy [rows, cols] (rows and
// cols of the copy as stored: [cols, rows] of the tensor for the columnwise
// copy).
struct BlockScaleLayout {
  fp8kit_scaling_mode mode;
  int64_t outer, inner;
  int64_t used_inner;  // inner entries that hold scales; the rest are padding


  FP8KIT_HD static BlockScaleLayout of(fp8kit_scaling_mode mode, int64_t rows, int64_t cols) {
    BlockScaleLayout l;
    l.mode = mode;
    if (mode == FP8KIT_SCALING_BLOCK_1X128) {
      l.outer = blocks_along(cols);
      l.used_inner = rows;
    } else {
      l.outer = blocks_along(rows);
      l.used_inner = blocks_along(cols);
    }
    l.inner = padded_inner(l.used_inner);
    return l;
  }

  FP8KIT_HD int64_t size() const { return outer * inner; }

  // Index of the scale of stored element (r, c).
  FP8KIT_HD int64_t index(int64_t r, int64_t c) const {
    return mode == FP8KIT_SCALING_BLOCK_1X128 ? (c / kBlockLen) * inner + r
                                              : (r / kBlockLen) * inner + c / kBlockLen;
  }
};

}  // namespace fp8kit

#endif  // FP8KIT_SRC_BLOCK_SCALE_LAYOUT_H_
