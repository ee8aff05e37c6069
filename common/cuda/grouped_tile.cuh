// The tiles of fp8kit::cuda's grouped per-tensor casts (grouped_quantize.cu):
// 64x64 tiles of a token-grouped input [T, F], each thread on 8
// consecutive elements of a row at a time (one 16-byte load where the rows
// allow; the 8 threads of a row reduce its amax by shuffles). A tile's rows
// may belong to several groups: each row's group is looked up once per
// tile (a binary search over the group starts, which travel in the kernel
// parameters), the amax of each group met is reduced in shared memory
// first and then with one global atomicMax per group and tile (|x| bits:
// for non-negative floats the bit order is the value order, NaN above inf).
#ifndef FP8KIT_CUDA_GROUPED_TILE_CUH_
#define FP8KIT_CUDA_GROUPED_TILE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8kit/grouped.h"
#include "grouped_layout.h"
#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {
namespace grouped_tile {

constexpr int kTile = 64;  // a block's tile: 64 rows x 64 columns
constexpr int kThreads = 256;
constexpr int kChunk = 8;  // consecutive elements per thread and row (one 16-byte load)
constexpr int kChunksPerRow = kTile / kChunk;          // 8 threads share a tile row
constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // 32
constexpr int kPasses = kTile / kRowsPerPass;           // 2
constexpr int kStride = FP8KIT_GROUP_SCALE_STRIDE;

// Where the groups lie, passed by value (8 KiB: CUDA 12.1+ takes kernel
// parameters up to 32 KiB), so no copy of the layout to the device is made.
struct Groups {
  int count;
  int32_t start[kMaxGroups + 1];         // first row of each group; [count] = T
  int32_t column_start[kMaxGroups + 1];  // first column of each block
};

struct Params {
  const void* input;
  int64_t rows, features;
  uint8_t* data;        // rowwise [T, F] or NULL
  uint8_t* columnwise;  // grouped columnwise copy or NULL
  float* scale;         // per group, kStride apart
  float* scale_inv;
  float* amax;          // atomicMax target (zeroed) or NULL
  const float* seeded;  // amax kernel: NULL measures every group; else only
                        // the fresh ones (flag 0), whose seed needs the amax
                        // before the cast (which measures every group)
  Groups groups;
};

// The group of `row` (the last group whose start is <= row; empty groups
// start where the next one does and are skipped).
__device__ __forceinline__ int group_of(const Groups& g, int32_t row) {
  int lo = 0, hi = g.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (g.start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Each tile row's group, and the slot of its amax in shared memory: the
// tile row where the group begins within the tile (so a tile touching
// groups g and g + 100, the ones between empty, needs two slots, not 101).
struct TileGroups {
  int row_group[kTile];
  int slot[kTile];
};

__device__ __forceinline__ void find_tile_groups(const Params& p, int64_t row0, TileGroups& t) {
  if (threadIdx.x < kTile) {
    const int64_t r = row0 + threadIdx.x;
    const int g = r < p.rows ? group_of(p.groups, int32_t(r)) : -1;
    t.row_group[threadIdx.x] = g;
    t.slot[threadIdx.x] = g < 0 ? 0 : int(max(int64_t(p.groups.start[g]), row0) - row0);
  }
}

// The tile of block (x: row tile, y: column tile): its first row and column.
__device__ __forceinline__ int64_t tile_row0() { return int64_t(blockIdx.x) * kTile; }
__device__ __forceinline__ int64_t tile_col0() { return int64_t(blockIdx.y) * kTile; }

// This thread's 8 elements of tile row `tr` (columns col .. col + 7; those
// at or past the end of the row read 0). kVec: the row is whole 16-byte
// vectors (features % 8 == 0, input 16-byte aligned).
template <int kIn, bool kVec>
__device__ __forceinline__ void load_chunk(const Params& p, int64_t r, int64_t col,
                                           Raw8<kIn>& raw) {
  const int64_t idx = r * p.features + col;
  if (kVec) {
    load_raw8<kIn>(p.input, idx, raw);
  } else {
    load_raw8_partial<kIn>(p.input, idx, int(min(p.features - col, int64_t(kChunk))), raw);
  }
}

// The largest |x| bits of a tile row, from the 8 threads that share it
// (8 consecutive lanes), folded into the row's group slot by one of them.
__device__ __forceinline__ void fold_row_amax(uint32_t bits, int tr, const TileGroups& t,
                                              uint32_t* tile_amax) {
#pragma unroll
  for (int offset = kChunksPerRow / 2; offset > 0; offset >>= 1) {
    bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
  }
  if (threadIdx.x % kChunksPerRow == 0 && bits != 0) atomicMax(&tile_amax[t.slot[tr]], bits);
}

// After the tile's |x| bits are folded into its slots: one global
// atomicMax per group met (a slot is non-zero only at a group's first row).
__device__ __forceinline__ void flush_tile_amax(const Params& p, const TileGroups& t,
                                                const uint32_t* tile_amax) {
  __syncthreads();
  if (threadIdx.x < kTile) {
    const uint32_t bits = tile_amax[threadIdx.x];
    if (bits != 0) {
      atomicMax(reinterpret_cast<unsigned int*>(p.amax) + t.row_group[threadIdx.x] * kStride,
                bits);
    }
  }
}

}  // namespace grouped_tile
}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GROUPED_TILE_CUH_
