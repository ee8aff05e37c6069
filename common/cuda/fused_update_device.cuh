// The end of a delayed-scaling cast kernel with the scaling-state update
// fused in: the state a job carries and the last-block update
// (threadfence-reduction pattern). Shared by the grouped quantize+update
// kernels (quantize_fused.cu) and the fused ops (norm_forward.cu,
// activation.cu), so all of them follow fp8kit_quantize_delayed_update.
#ifndef FP8KIT_CUDA_FUSED_UPDATE_DEVICE_CUH_
#define FP8KIT_CUDA_FUSED_UPDATE_DEVICE_CUH_

#include <cuda_runtime.h>

#include "compute_scale.h"
#include "delayed_update_device.cuh"

namespace fp8kit {
namespace cuda {

// One job's state (fp8kit_delayed_quantize_state) and its FP8 maximum.
struct FusedState {
  float* history;
  float* amax;
  float* scale;
  float* scale_inv;
  unsigned int* counter;
  float* seeded;  // NULL: seeded
  float fp8_max;
};

struct UpdateConfig {
  int amax_history_len;
  int margin;
  int most_recent;
  int record;  // 0: leave history, scale, scale_inv and seeded as they are
};

// Called by every thread of a block after the block's cast (whose thread 0
// made the amax atomic). The job's last block runs the update when
// recording, and in both modes resets the accumulator and the counter.
__device__ __forceinline__ void finish_job(const FusedState& s, const UpdateConfig& c,
                                           unsigned int job_blocks) {
  __shared__ bool last;
  __shared__ float newest;
  if (threadIdx.x == 0) {
    __threadfence();  // this block's amax atomic is visible before it counts
    last = atomicAdd(s.counter, 1u) == job_blocks - 1;
    if (last && c.record) {
      __threadfence();
      newest = __uint_as_float(atomicOr(reinterpret_cast<unsigned int*>(s.amax), 0u));
    }
  }
  __syncthreads();
  if (!last) return;
  if (c.record) {
    const float r =
        roll_history_and_reduce(s.history, c.amax_history_len, newest, c.most_recent != 0);
    if (threadIdx.x == 0) {
      // The scale the cast used (read_scale's rule) is the update's previous scale.
      float used = *s.scale;
      if (s.seeded != nullptr && *s.seeded == 0.0f) {
        used = delayed_scale_from_amax(newest, used, s.fp8_max, c.margin);
      }
      used = checked_scale(used);
      const float scale = delayed_scale_from_amax(r, used, s.fp8_max, c.margin);
      *s.scale = scale;
      *s.scale_inv = reciprocal(scale);
      if (s.seeded != nullptr) *s.seeded = 1.0f;
    }
  }
  if (threadIdx.x == 0) {
    *s.amax = 0.0f;
    *s.counter = 0u;
  }
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_FUSED_UPDATE_DEVICE_CUH_
