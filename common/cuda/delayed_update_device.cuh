// The block-wide core of the delayed-scaling update, shared by the update
// kernel (delayed_scaling.cu) and the fused quantize+update kernels
// (quantize_fused.cu), so both follow delayed_scaling_cpu.cc step for step.
#ifndef FP8KIT_CUDA_DELAYED_UPDATE_DEVICE_CUH_
#define FP8KIT_CUDA_DELAYED_UPDATE_DEVICE_CUH_

#include <cuda_runtime.h>

#include "compute_scale.h"

namespace fp8kit {
namespace cuda {

// Rolls h[0..len) by one with `newest` as the new h[0] and returns the
// reduced amax to thread 0: the NaN-propagating max of the new history, or
// `newest` when `most_recent`. Every thread of the block calls it; blockDim.x
// is a multiple of 32 (at most 1024). The history rolls in chunks of
// blockDim.x elements from the end: each chunk reads h[i-1], syncs, writes
// h[i], syncs, so no value is overwritten before it is read. The caller
// reads `newest` (and syncs) before calling when it may alias h.
__device__ __forceinline__ float roll_history_and_reduce(float* h, int len, float newest,
                                                        bool most_recent) {
  __shared__ float warp_red[32];
  float reduced = newest;  // NaN-propagating max of what this thread wrote
  const int step = int(blockDim.x);
  for (int c = (len - 1) / step; c >= 0; --c) {
    const int i = c * step + int(threadIdx.x);
    float v = 0.0f;
    if (i < len) v = (i == 0) ? newest : h[i - 1];
    __syncthreads();  // reads of this chunk before its writes
    if (i < len) {
      h[i] = v;
      reduced = max_nan(reduced, v);
    }
    __syncthreads();  // this chunk's writes before the next (lower) chunk's writes
  }
  if (most_recent) return newest;
  for (int off = 16; off > 0; off >>= 1) {
    reduced = max_nan(reduced, __shfl_xor_sync(0xffffffffu, reduced, off));
  }
  if ((threadIdx.x & 31) == 0) warp_red[threadIdx.x >> 5] = reduced;
  __syncthreads();
  float r = newest;
  if (threadIdx.x == 0) {
    for (int w = 0; w < step / 32; ++w) r = max_nan(r, warp_red[w]);
  }
  return r;
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_DELAYED_UPDATE_DEVICE_CUH_
