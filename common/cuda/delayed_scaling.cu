// fp8kit::cuda::delayed_scaling_update: one launch per chunk of up to 64
// tensors, their states passed by value in the kernel parameters (no
// host-to-device copy, no allocation); one block per tensor.
//
// Per block: every thread reads the new amax first (it may alias the
// history), then roll_history_and_reduce (delayed_update_device.cuh), and
// thread 0 computes the scale with compute_scale.h, as the CPU reference
// does.
#include <cuda_runtime.h>

#include "compute_scale.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "delayed_update_device.cuh"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kChunk = 64;  // tensors per launch
constexpr int kDsThreads = 128;

struct DelayedScalingChunk {
  fp8kit_delayed_scaling_state states[kChunk];
  int amax_history_len;
  int margin;
  int most_recent;  // FP8KIT_AMAX_MOST_RECENT
  float fp8_max[kChunk];
};

__global__ void __launch_bounds__(kDsThreads)
    delayed_scaling_kernel(const DelayedScalingChunk chunk) {
  const fp8kit_delayed_scaling_state& st = chunk.states[blockIdx.x];
  const float newest = *st.amax;
  __syncthreads();  // every read of *amax happens before any history write
  const float r = roll_history_and_reduce(st.amax_history, chunk.amax_history_len, newest,
                                          chunk.most_recent != 0);
  if (threadIdx.x == 0) {
    const float scale =
        delayed_scale_from_amax(r, *st.scale, chunk.fp8_max[blockIdx.x], chunk.margin);
    *st.scale = scale;
    *st.scale_inv = reciprocal(scale);
  }
}

}  // namespace

void delayed_scaling_update(const fp8kit_delayed_scaling_state* states, int count,
                            const fp8kit_delayed_scaling_config& config, int device_index,
                            void* stream_ptr) {
  const char* op = "delayed_scaling_update";
  ScopedDevice device(device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  for (int first = 0; first < count; first += kChunk) {
    const int n = (count - first) < kChunk ? (count - first) : kChunk;
    DelayedScalingChunk chunk{};
    for (int i = 0; i < n; ++i) {
      chunk.states[i] = states[first + i];
      chunk.fp8_max[i] = fp8kit_fp8_max(states[first + i].fp8_dtype);
    }
    chunk.amax_history_len = config.amax_history_len;
    chunk.margin = config.margin;
    chunk.most_recent = config.amax_reduction == FP8KIT_AMAX_MOST_RECENT;
    delayed_scaling_kernel<<<n, kDsThreads, 0, stream>>>(chunk);
    check_launch(op, "launching the delayed-scaling update kernel");
  }
}

}  // namespace cuda
}  // namespace fp8kit
