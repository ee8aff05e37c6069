// A thread's 8x8 part of a block-scaled quantization tile
// (quantize_block.cu): where it waits in shared memory while the block
// agrees on its scales (PartStage), and the amaxes of its rows and
// columns, folded in as it is loaded (PartAmax) and combined across a
// warp's lanes (max_scatter).
#ifndef FP8KIT_CUDA_BLOCK_PART_CUH_
#define FP8KIT_CUDA_BLOCK_PART_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {

constexpr int kPart = 8;  // a thread's part: kPart x kPart elements

// Shared memory that parks each thread's raw part between its load and
// its casts: vector v of row k of thread t's part at [(k * kVecs + v) *
// kThreads + t], so that a warp's access is 32 consecutive 16-byte
// vectors, 4 wavefronts, the fewest for 512 bytes. No thread reads
// another's part, so this needs no swizzle or padding.
template <int kIn, int kThreads>
struct PartStage {
  static constexpr int kVecs = Raw8<kIn>::kVecs;
  static constexpr size_t kBytes = size_t(kPart) * kVecs * kThreads * sizeof(uint4);
  uint4* s;

  __device__ explicit PartStage(void* smem) : s(static_cast<uint4*>(smem)) {}
  __device__ void put(int k, const Raw8<kIn>& raw) const {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) s[(k * kVecs + v) * kThreads + threadIdx.x] = raw.v[v];
  }
  // A volatile read, so that a second pass over the part reads it again
  // rather than the compiler keeping the first pass's values in
  // registers, which it would spill.
  __device__ void get(int k, Raw8<kIn>& raw) const {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const uint4* vec = s + (k * kVecs + v) * kThreads + threadIdx.x;
      const unsigned at = unsigned(__cvta_generic_to_shared(vec));
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(raw.v[v].x), "=r"(raw.v[v].y), "=r"(raw.v[v].z), "=r"(raw.v[v].w)
                   : "r"(at)
                   : "memory");
    }
  }
};

// The largest |x| bit patterns of a part, folded in as its rows arrive,
// of each row (row) and each column (col), packed as the input is: two
// 16-bit patterns a word (item i in word i / 2, half i % 2), or one
// float32 pattern. For bf16 and fp16 the input's own patterns are
// compared: with the sign cleared their unsigned order is the value order
// with NaN above inf, as is that of the widened float32 patterns that the
// CPU reference compares, so the largest widens (abs_float_bits) to the
// largest of those, or to a NaN where that is one: the same scale.
template <int kIn>
struct PartAmax {
  static constexpr bool k16 = kIn != FP8KIT_FLOAT32;
  static constexpr int kPerWord = k16 ? 2 : 1;
  static constexpr int kWords = kPart / kPerWord;
  uint32_t row[kWords] = {};
  uint32_t col[kWords] = {};

  __device__ static uint32_t word_max(uint32_t a, uint32_t b) {
    return k16 ? __vmaxu2(a, b) : max(a, b);
  }
  // Folds in row k (a compile-time constant after unrolling).
  __device__ void fold(int k, const Raw8<kIn>& raw) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const uint32_t a = u4_word(raw.v[i / 4], i % 4) & (k16 ? 0x7fff7fffu : 0x7fffffffu);
      col[i] = word_max(col[i], a);
      m = word_max(m, a);
    }
    if (k16) m = max(m & 0xffffu, m >> 16);
    row[k / kPerWord] |= m << (16 * (k % kPerWord));
  }
  // Item i as float32 bits.
  __device__ static uint32_t bits(const uint32_t (&words)[kWords], int i) {
    return abs_float_bits<kIn>(words[i / kPerWord] >> (16 * (i % kPerWord)));
  }
  __device__ uint32_t row_bits(int k) const { return bits(row, k); }
  __device__ uint32_t col_bits(int j) const { return bits(col, j); }
};

// Max of v over this lane and the lanes that differ from it in the mask
// bits, reduce-scattered: each step (one mask, the largest first) gives
// the partner lane the half of v this lane drops and takes the partner's
// copy of the half it keeps (the upper half where lane & mask), so kN
// values over n bits take kN/2 + kN/4 + ... shuffles, not kN * n, and
// leave kN >> n: v[i] is then item i + the offsets of the halves kept.
template <int kN, unsigned kMask, unsigned... kMasks>
__device__ __forceinline__ void max_scatter(uint32_t* v) {
  constexpr int kHalf = kN / 2;
  const bool upper = (threadIdx.x & kMask) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const uint32_t give = upper ? v[i] : v[i + kHalf];
    const uint32_t keep = upper ? v[i + kHalf] : v[i];
    v[i] = max(keep, __shfl_xor_sync(0xffffffffu, give, kMask));
  }
  if constexpr (sizeof...(kMasks) > 0) max_scatter<kHalf, kMasks...>(v);
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_BLOCK_PART_CUH_
