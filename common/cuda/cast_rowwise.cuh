// The elementwise cast kernel: rowwise-only quantization (and any shape
// whose columnwise layout equals the row-major one: a single row or a
// single column), treating the tensor as a flat array.
//
// Each thread casts 2 chunks of 16 consecutive elements: two (four for
// float32) 16-byte loads and one 16-byte store per chunk, all loads of the
// thread issued before the first conversion. Consecutive threads own
// consecutive chunks, so every warp instruction touches contiguous memory.
// Blocks whose range reaches past the end (and misaligned buffers) take
// the predicated path.
#ifndef FP8KIT_CUDA_CAST_ROWWISE_CUH_
#define FP8KIT_CUDA_CAST_ROWWISE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {

constexpr int kFlatThreads = 256;
constexpr int kFlatWarps = kFlatThreads / 32;
constexpr int kFlatChunk = 16;   // elements per chunk (one 16-byte FP8 store)
constexpr int kFlatUnroll = 2;   // chunks per thread
constexpr int64_t kFlatBlockElems = int64_t(kFlatThreads) * kFlatChunk * kFlatUnroll;

struct CastFlatParams {
  const void* in;
  uint8_t* out;    // written
  uint8_t* out2;   // written too when non-NULL (the columnwise copy, same layout)
  float* amax;     // atomicMax target (zeroed) or NULL
  ScaleSource scale;
  int64_t n;
  bool vec;        // in, out (and out2) 16-byte aligned
};

template <int kIn, bool kE4M3>
__global__ void __launch_bounds__(kFlatThreads) cast_flat_kernel(const CastFlatParams p) {
  __shared__ uint32_t warp_max[kFlatWarps];
  uint32_t amax_bits = 0;
  const int64_t block_base = int64_t(blockIdx.x) * kFlatBlockElems;

  Raw8<kIn> raw[kFlatUnroll][2];
  if (p.vec && block_base + kFlatBlockElems <= p.n) {
#pragma unroll
    for (int u = 0; u < kFlatUnroll; ++u) {
      const int64_t base = block_base + int64_t(u * kFlatThreads + threadIdx.x) * kFlatChunk;
      load_raw8<kIn>(p.in, base, raw[u][0]);
      load_raw8<kIn>(p.in, base + 8, raw[u][1]);
    }
    const float scale = read_scale(p.scale);  // after the loads: it may wait (pdl.cuh)
#pragma unroll
    for (int u = 0; u < kFlatUnroll; ++u) {
      const int64_t base = block_base + int64_t(u * kFlatThreads + threadIdx.x) * kFlatChunk;
      const uint2 a = cast8<kIn, kE4M3>(raw[u][0], scale, amax_bits);
      const uint2 b = cast8<kIn, kE4M3>(raw[u][1], scale, amax_bits);
      const uint4 v = make_uint4(a.x, a.y, b.x, b.y);
      *reinterpret_cast<uint4*>(p.out + base) = v;
      if (p.out2 != nullptr) *reinterpret_cast<uint4*>(p.out2 + base) = v;
    }
  } else {
    const float scale = read_scale(p.scale);
#pragma unroll
    for (int u = 0; u < kFlatUnroll; ++u) {
      const int64_t base = block_base + int64_t(u * kFlatThreads + threadIdx.x) * kFlatChunk;
      const int64_t left = p.n - base;
      const int valid = left >= kFlatChunk ? kFlatChunk : (left > 0 ? int(left) : 0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int vh = valid - 8 * h >= 8 ? 8 : (valid > 8 * h ? valid - 8 * h : 0);
        if (p.vec && vh == 8) {
          load_raw8<kIn>(p.in, base + 8 * h, raw[u][h]);
        } else {
          load_raw8_partial<kIn>(p.in, base + 8 * h, vh, raw[u][h]);
        }
      }
      const uint2 a = cast8<kIn, kE4M3>(raw[u][0], scale, amax_bits);
      const uint2 b = cast8<kIn, kE4M3>(raw[u][1], scale, amax_bits);
      const uint4 v = make_uint4(a.x, a.y, b.x, b.y);
      if (p.vec && valid == kFlatChunk) {
        *reinterpret_cast<uint4*>(p.out + base) = v;
        if (p.out2 != nullptr) *reinterpret_cast<uint4*>(p.out2 + base) = v;
      } else {
#pragma unroll
        for (int i = 0; i < kFlatChunk; ++i) {
          if (i < valid) {
            p.out[base + i] = u4_byte(v, i);
            if (p.out2 != nullptr) p.out2[base + i] = u4_byte(v, i);
          }
        }
      }
    }
  }

  amax_block_publish(amax_bits, warp_max);
  __syncthreads();
  if (p.amax != nullptr) amax_block_commit<kFlatWarps>(warp_max, p.amax);
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_CAST_ROWWISE_CUH_
