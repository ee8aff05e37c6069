// The elementwise cast kernel: rowwise-only quantization (and any shape
// whose columnwise layout equals the row-major one: a single row or a
// single column), treating the tensor as a flat array.
//
// Each thread casts 4 groups of 8 consecutive elements: one 16-byte load
// (two for float32) and one 8-byte store per group, all loads of the
// thread issued before the first conversion. Group k of thread t is group
// k * 256 + t of the block, so every warp instruction reads 512 and writes
// 256 contiguous bytes. Blocks whose range reaches past the end (and
// misaligned buffers) take the predicated path.
#ifndef FP8KIT_CUDA_CAST_ROWWISE_CUH_
#define FP8KIT_CUDA_CAST_ROWWISE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {

constexpr int kFlatThreads = 256;
constexpr int kFlatWarps = kFlatThreads / 32;
constexpr int kFlatGroups = 4;  // groups of 8 elements per thread
constexpr int64_t kFlatBlockElems = int64_t(kFlatThreads) * kFlatGroups * 8;

struct CastFlatParams {
  const void* in;
  uint8_t* out;    // written
  uint8_t* out2;   // written too when non-NULL (the columnwise copy, same layout)
  float* amax;     // atomicMax target (zeroed) or NULL
  ScaleSource scale;
  int64_t n;
  bool vec;        // `in` 16-byte aligned, out (and out2) 8-byte aligned
};

// Block `block` of the flat range: the whole work of one block. Shared by
// the one-tensor kernel below and the grouped kernels of quantize_fused.cu.
template <int kIn, bool kE4M3>
__device__ __forceinline__ void cast_flat_block(const CastFlatParams& p, int64_t block) {
  __shared__ uint32_t warp_max[kFlatWarps];
  uint32_t amax_bits = 0;
  const int64_t block_base = block * kFlatBlockElems;

  Raw8<kIn> raw[kFlatGroups];
  if (p.vec && block_base + kFlatBlockElems <= p.n) {
#pragma unroll
    for (int k = 0; k < kFlatGroups; ++k) {
      load_raw8<kIn>(p.in, block_base + int64_t(k * kFlatThreads + threadIdx.x) * 8, raw[k]);
    }
    const float scale = read_scale(p.scale, block == 0);  // after the loads: it may wait (pdl.cuh)
#pragma unroll
    for (int k = 0; k < kFlatGroups; ++k) {
      const int64_t e = block_base + int64_t(k * kFlatThreads + threadIdx.x) * 8;
      const uint2 q = cast8<kIn, kE4M3>(raw[k], scale, amax_bits);
      *reinterpret_cast<uint2*>(p.out + e) = q;
      if (p.out2 != nullptr) *reinterpret_cast<uint2*>(p.out2 + e) = q;
    }
  } else {
    const float scale = read_scale(p.scale, block == 0);
#pragma unroll
    for (int k = 0; k < kFlatGroups; ++k) {
      const int64_t e = block_base + int64_t(k * kFlatThreads + threadIdx.x) * 8;
      const int64_t left = p.n - e;
      const int valid = left >= 8 ? 8 : (left > 0 ? int(left) : 0);
      if (p.vec && valid == 8) {
        load_raw8<kIn>(p.in, e, raw[k]);
      } else {
        load_raw8_partial<kIn>(p.in, e, valid, raw[k]);
      }
      const uint2 q = cast8<kIn, kE4M3>(raw[k], scale, amax_bits);
      if (p.vec && valid == 8) {
        *reinterpret_cast<uint2*>(p.out + e) = q;
        if (p.out2 != nullptr) *reinterpret_cast<uint2*>(p.out2 + e) = q;
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (i < valid) {
            p.out[e + i] = u2_byte(q, i);
            if (p.out2 != nullptr) p.out2[e + i] = u2_byte(q, i);
          }
        }
      }
    }
  }

  amax_block_publish(amax_bits, warp_max);
  __syncthreads();
  if (p.amax != nullptr) amax_block_commit<kFlatWarps>(warp_max, p.amax);
}

template <int kIn, bool kE4M3>
__global__ void __launch_bounds__(kFlatThreads) cast_flat_kernel(const CastFlatParams p) {
  cast_flat_block<kIn, kE4M3>(p, blockIdx.x);
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_CAST_ROWWISE_CUH_
