// fp8kit::cuda::delayed_scaling_update: one launch per chunk of up to 64
// tensors, their states passed by value in the kernel parameters (no
// host-to-device copy, no allocation); one block per tensor.
//
// Per block: every thread reads the new amax first (it may alias the
// history), the history rolls by one in chunks of blockDim elements from
// the end (each chunk reads h[i-1], syncs, writes h[i], syncs, so no value
// is overwritten before it is read), h[0] = amax, the reduction runs over
// the values each thread just wrote, and thread 0 computes the scale with
// compute_scale.h, as the CPU reference does.
#include <cuda_runtime.h>

#include "compute_scale.h"
#include "cuda_backend.h"
#include "cuda_check.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kChunk = 64;  // tensors per launch
constexpr int kDsThreads = 128;

struct DelayedScalingChunk {
  fp8kit_delayed_scaling_state states[kChunk];
  int history_len;
  int margin;
  int most_recent;  // FP8KIT_AMAX_MOST_RECENT
  float fp8_max[kChunk];
};

__global__ void __launch_bounds__(kDsThreads)
    delayed_scaling_kernel(const DelayedScalingChunk chunk) {
  __shared__ float warp_red[kDsThreads / 32];
  const fp8kit_delayed_scaling_state& st = chunk.states[blockIdx.x];
  const int len = chunk.history_len;
  float* h = st.amax_history;
  const float newest = *st.amax;
  __syncthreads();  // every read of *amax happens before any history write

  float reduced = newest;  // NaN-propagating max of what this thread wrote
  const int last_chunk = (len - 1) / kDsThreads;
  for (int c = last_chunk; c >= 0; --c) {
    const int i = c * kDsThreads + threadIdx.x;
    float v = 0.0f;
    if (i < len) v = (i == 0) ? newest : h[i - 1];
    __syncthreads();  // reads of this chunk before its writes
    if (i < len) {
      h[i] = v;
      reduced = max_nan(reduced, v);
    }
    __syncthreads();  // this chunk's writes before the next (lower) chunk's writes
  }

  if (!chunk.most_recent) {
    for (int off = 16; off > 0; off >>= 1) {
      reduced = max_nan(reduced, __shfl_xor_sync(0xffffffffu, reduced, off));
    }
    if ((threadIdx.x & 31) == 0) warp_red[threadIdx.x >> 5] = reduced;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float r = newest;
    if (!chunk.most_recent) {
      for (int w = 0; w < kDsThreads / 32; ++w) r = max_nan(r, warp_red[w]);
    }
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
    chunk.history_len = config.history_len;
    chunk.margin = config.margin;
    chunk.most_recent = config.reduction == FP8KIT_AMAX_MOST_RECENT;
    delayed_scaling_kernel<<<n, kDsThreads, 0, stream>>>(chunk);
    check_launch(op, "launching the delayed-scaling update kernel");
  }
}

}  // namespace cuda
}  // namespace fp8kit
