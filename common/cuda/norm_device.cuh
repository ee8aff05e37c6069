// Device code the normalization kernels share (norm_forward.cu,
// norm_backward.cu): the last step of fp8kit/normalization.h's row-sum
// order, done by one warp.
#ifndef FP8KIT_CUDA_NORM_DEVICE_CUH_
#define FP8KIT_CUDA_NORM_DEVICE_CUH_

#include "float_math.h"
#include "norm_math.h"

namespace fp8kit {

// The row sum of fp8kit/normalization.h: `lane_sum` is this lane's
// in-order sum of its chunks; every lane returns lane 0's total.
__device__ __forceinline__ float warp_row_sum(float lane_sum) {
#pragma unroll
  for (int o = kNormLanes / 2; o > 0; o >>= 1) {
    lane_sum = add_rn(lane_sum, __shfl_xor_sync(0xffffffffu, lane_sum, o));
  }
  return __shfl_sync(0xffffffffu, lane_sum, 0);
}

}  // namespace fp8kit

#endif  // FP8KIT_CUDA_NORM_DEVICE_CUH_
