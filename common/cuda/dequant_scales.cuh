// The scale_inv an FP8 copy is read with, element by element: the tensor's
// one float (per-tensor) or its block's (1x128, 128x128), for the rowwise
// copy or the columnwise one. Shared by dequantize and cast_statistics, so
// both read a copy's scales the same way.
#ifndef FP8KIT_CUDA_DEQUANT_SCALES_CUH_
#define FP8KIT_CUDA_DEQUANT_SCALES_CUH_

#include <cstdint>

#include "block_scale_layout.h"
#include "fp8kit/tensor.h"

namespace fp8kit {
namespace cuda {

struct DequantScales {
  const float* scale_inv;
  bool block;
  BlockScaleLayout layout;  // of the copy as stored (block scaling only)

  // Stored element (r, c)'s scale_inv; `per_tensor` is *scale_inv, which a
  // kernel loads once (unused under block scaling).
  __device__ __forceinline__ float at(int64_t r, int64_t c, float per_tensor) const {
    return block ? scale_inv[layout.index(r, c)] : per_tensor;
  }
};

// The scales of `q`'s rowwise copy, or with from_columnwise its columnwise
// one, for a logical [rows, cols] tensor.
inline DequantScales dequant_scales(const fp8kit_tensor& q, bool from_columnwise, int64_t rows,
                                    int64_t cols) {
  DequantScales s;
  s.block = is_block_scaling(q.scaling_mode);
  s.scale_inv = !s.block         ? q.scale_inv
                : from_columnwise ? q.columnwise_block_scale_inv
                                  : q.block_scale_inv;
  s.layout = from_columnwise ? BlockScaleLayout::of(q.scaling_mode, cols, rows)
                             : BlockScaleLayout::of(q.scaling_mode, rows, cols);
  return s;
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_DEQUANT_SCALES_CUH_
