// The amax reduction kernels (fp8kit_amax on CUDA, and the first pass of
// current scaling, of one tensor or of several in one launch): max |x| over
// a flat buffer, NaN-propagating.
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
constexpr int kMaxAmaxJobs = 64;  // tensors per launch_amax_many (the C API's limit)

// One buffer of launch_amax_many, split as amax_split says.
struct AmaxJob {
  const void* data;
  int64_t head, n_vec, n;
  fp8kit_dtype dtype;
  float* amax;
};

struct AmaxJobs {
  AmaxJob job[kMaxAmaxJobs];
  int count;
};

__global__ void zero_amax_kernel(float* amax) {
  pdl_trigger();  // the dependent may start; it waits for our write itself
  *amax = 0.0f;
}

// max |x| bits over this thread's share of one buffer: threads `tid` of
// `stride` stride over its 16-byte vectors, then its scalar head and tail.
template <int kIn>
__device__ __forceinline__ uint32_t strided_amax_bits(const void* __restrict__ data, int64_t head,
                                                      int64_t n_vec, int64_t n, int64_t tid,
                                                      int64_t stride) {
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
  return amax_bits;
}

template <int kIn>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const void* __restrict__ data, int64_t head, int64_t n_vec, int64_t n,
                float* amax) {
  __shared__ uint32_t warp_max[kAmaxWarps];
  const uint32_t amax_bits =
      strided_amax_bits<kIn>(data, head, n_vec, n, int64_t(blockIdx.x) * kAmaxThreads + threadIdx.x,
                             int64_t(gridDim.x) * kAmaxThreads);
  amax_block_publish(amax_bits, warp_max);
  __syncthreads();
  amax_block_commit<kAmaxWarps>(warp_max, amax);
}

// The amax of each of several buffers (AmaxJobs), blockIdx.y picking the
// buffer, each into its own accumulator, which zero_amaxes_kernel zeroed
// just before.
__global__ void __launch_bounds__(kAmaxThreads) amax_many_kernel(const __grid_constant__ AmaxJobs jobs) {
  __shared__ uint32_t warp_max[kAmaxWarps];
  const AmaxJob& j = jobs.job[blockIdx.y];
  const int64_t tid = int64_t(blockIdx.x) * kAmaxThreads + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * kAmaxThreads;
  uint32_t amax_bits;
  switch (j.dtype) {
    case FP8KIT_FLOAT32:
      amax_bits = strided_amax_bits<FP8KIT_FLOAT32>(j.data, j.head, j.n_vec, j.n, tid, stride);
      break;
    case FP8KIT_BFLOAT16:
      amax_bits = strided_amax_bits<FP8KIT_BFLOAT16>(j.data, j.head, j.n_vec, j.n, tid, stride);
      break;
    default:
      amax_bits = strided_amax_bits<FP8KIT_FLOAT16>(j.data, j.head, j.n_vec, j.n, tid, stride);
      break;
  }
  amax_block_publish(amax_bits, warp_max);
  __syncthreads();
  amax_block_commit<kAmaxWarps>(warp_max, j.amax);
}

__global__ void zero_amaxes_kernel(const __grid_constant__ AmaxJobs jobs) {
  pdl_trigger();
  if (int(threadIdx.x) < jobs.count) *jobs.job[threadIdx.x].amax = 0.0f;
}

// How the vector loop splits n elements of `dtype` at `data`: `head`
// elements before the first 16-byte boundary, n_vec vectors, and the
// blocks of kAmaxThreads that have work (at least 1).
struct AmaxSplit {
  int64_t head, n_vec, blocks;
};

AmaxSplit amax_split(const void* data, fp8kit_dtype dtype, int64_t n) {
  const int64_t bytes = dtype == FP8KIT_FLOAT32 ? 4 : 2;
  const int64_t per_vec = 16 / bytes;
  // Elements before the first 16-byte boundary (data is element-aligned).
  const uintptr_t addr = reinterpret_cast<uintptr_t>(data);
  int64_t head = int64_t(((16 - addr % 16) % 16) / uintptr_t(bytes));
  if (addr % uintptr_t(bytes) != 0 || head > n) head = n;  // misaligned elements: all scalar
  const int64_t n_vec = (n - head) / per_vec;
  const int64_t work = n_vec > 0 ? ceil_div(n_vec, kAmaxUnroll) : (n > 0 ? n : 1);
  return {head, n_vec, ceil_div(work, kAmaxThreads)};
}

template <int kIn>
void launch_amax_typed(const void* data, int64_t n, float* amax, cudaStream_t stream,
                       const char* op) {
  const AmaxSplit split = amax_split(data, fp8kit_dtype(kIn), n);
  const int64_t max_blocks = int64_t(sm_count(op)) * kAmaxBlocksPerSm;
  const int64_t blocks = split.blocks < max_blocks ? split.blocks : max_blocks;
  launch_pdl(amax_kernel<kIn>, dim3(unsigned(blocks)), dim3(kAmaxThreads), stream, op,
             "launching the amax kernel", data, split.head, split.n_vec, n, amax);
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

void launch_amax_many(const fp8kit_tensor* inputs, const fp8kit_tensor* outputs, int count,
                      cudaStream_t stream, const char* op) {
  AmaxJobs jobs{};
  jobs.count = count;
  int64_t blocks = 1;
  for (int i = 0; i < count; ++i) {
    const int64_t n = fp8kit_tensor_numel(&inputs[i]);
    const AmaxSplit split = amax_split(inputs[i].data, inputs[i].dtype, n);
    jobs.job[i] = AmaxJob{inputs[i].data, split.head, split.n_vec, n, inputs[i].dtype,
                        outputs[i].amax};
    if (n > 0 && split.blocks > blocks) blocks = split.blocks;
  }
  zero_amaxes_kernel<<<1, kMaxAmaxJobs, 0, stream>>>(jobs);
  check_launch(op, "launching the amax zeroing kernel");
  // The largest tensor's grid, capped as for one tensor: a smaller
  // tensor's surplus blocks find no work and only commit a zero.
  const int64_t max_blocks = int64_t(sm_count(op)) * kAmaxBlocksPerSm;
  if (blocks > max_blocks) blocks = max_blocks;
  launch_pdl(amax_many_kernel, dim3(unsigned(blocks), unsigned(count)), dim3(kAmaxThreads),
             stream, op, "launching the amax kernel", jobs);
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
