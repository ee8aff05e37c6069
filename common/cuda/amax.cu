// The amax reduction kernel (fp8kit_amax on CUDA, and the first pass of
// current scaling): max |x| over a flat buffer, NaN-propagating.
//
// Read-only and bandwidth-bound: a grid of a few blocks per SM strides over
// 16-byte vectors, each thread keeping 4 vector loads in flight, folding
// |x| bit patterns (16-bit formats two at a time with a SIMD max), then one
// warp max, one block max and one atomicMax per block on *amax, which a
// one-thread kernel zeroes just before (launched back to back with
// programmatic dependent launch, so no launch gap; see pdl.cuh). Elements
// before the first 16-byte boundary and after the last are read one by one.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch_config.h"
#include "pdl.cuh"
#include "quantize_device.cuh"
#include "quantize_launch.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kAmaxThreads = 256;
constexpr int kAmaxWarps = kAmaxThreads / 32;
constexpr int kAmaxUnroll = 4;
constexpr int kAmaxBlocksPerSm = 8;

__global__ void zero_amax_kernel(float* amax) {
  pdl_trigger();  // the dependent may start; it waits for our write itself
  *amax = 0.0f;
}

template <int kIn>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const void* __restrict__ data, int64_t head, int64_t n_vec, int64_t n,
                float* amax) {
  __shared__ uint32_t warp_max[kAmaxWarps];
  const int64_t tid = int64_t(blockIdx.x) * kAmaxThreads + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * kAmaxThreads;
  constexpr int kPerVec = (kIn == FP8KIT_FLOAT32) ? 4 : 8;
  const uint4* vec = reinterpret_cast<const uint4*>(
      static_cast<const char*>(data) + head * (kIn == FP8KIT_FLOAT32 ? 4 : 2));

  // Vector part: 32-bit lanes hold one float32 or two 16-bit magnitudes.
  uint32_t acc = 0;
  for (int64_t i = tid; i < n_vec; i += kAmaxUnroll * stride) {
    uint4 v[kAmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      const int64_t j = i + u * stride;
      v[u] = j < n_vec ? __ldg(vec + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t word = u4_word(v[u], w);
        if constexpr (kIn == FP8KIT_FLOAT32) {
          acc = max(acc, word & 0x7fffffffu);
        } else {
          acc = __vmaxu2(acc, word & 0x7fff7fffu);
        }
      }
    }
  }
  uint32_t amax_bits;
  if constexpr (kIn == FP8KIT_FLOAT32) {
    amax_bits = acc;
  } else {
    amax_bits = max(abs_float_bits<kIn>(acc & 0xffffu), abs_float_bits<kIn>(acc >> 16));
  }

  // Scalar head [0, head) and tail [head + n_vec * kPerVec, n).
  const int64_t tail0 = head + n_vec * kPerVec;
  const int64_t scalar_count = head + (n - tail0);
  for (int64_t i = tid; i < scalar_count; i += stride) {
    const int64_t e = i < head ? i : tail0 + (i - head);
    amax_bits = max(amax_bits, abs_float_bits<kIn>(load_bits<kIn>(data, e)));
  }

  amax_block_publish(amax_bits, warp_max);
  __syncthreads();
  amax_block_commit<kAmaxWarps>(warp_max, amax);
}

template <int kIn>
void launch_amax_typed(const void* data, int64_t n, float* amax, cudaStream_t stream,
                       const char* op) {
  constexpr int kBytes = (kIn == FP8KIT_FLOAT32) ? 4 : 2;
  constexpr int kPerVec = 16 / kBytes;
  // Elements before the first 16-byte boundary (data is element-aligned).
  const uintptr_t addr = reinterpret_cast<uintptr_t>(data);
  int64_t head = int64_t(((16 - addr % 16) % 16) / kBytes);
  if (addr % kBytes != 0 || head > n) head = n;  // misaligned elements: all scalar
  const int64_t n_vec = (n - head) / kPerVec;
  const int64_t work = n_vec > 0 ? ceil_div(n_vec, kAmaxUnroll) : (n > 0 ? n : 1);
  int64_t blocks = ceil_div(work, kAmaxThreads);
  const int64_t max_blocks = int64_t(sm_count(op)) * kAmaxBlocksPerSm;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  launch_pdl(amax_kernel<kIn>, dim3(unsigned(blocks)), dim3(kAmaxThreads), stream, op,
             "launching the amax kernel", data, head, n_vec, n, amax);
}

}  // namespace

void launch_zero_amax(float* amax, cudaStream_t stream, const char* op) {
  zero_amax_kernel<<<1, 1, 0, stream>>>(amax);
  check_launch(op, "launching the amax zeroing kernel");
}

void launch_amax(const void* data, fp8kit_dtype dtype, int64_t n, float* amax,
                 cudaStream_t stream, const char* op) {
  switch (dtype) {
    case FP8KIT_FLOAT32: launch_amax_typed<FP8KIT_FLOAT32>(data, n, amax, stream, op); break;
    case FP8KIT_BFLOAT16: launch_amax_typed<FP8KIT_BFLOAT16>(data, n, amax, stream, op); break;
    default: launch_amax_typed<FP8KIT_FLOAT16>(data, n, amax, stream, op); break;
  }
}

void amax(const fp8kit_tensor& input, float* amax_out, void* stream_ptr) {
  const char* op = "amax";
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  launch_zero_amax(amax_out, stream, op);
  const int64_t n = fp8kit_tensor_numel(&input);
  if (n > 0) launch_amax(input.data, input.dtype, n, amax_out, stream, op);
}

}  // namespace cuda
}  // namespace fp8kit
