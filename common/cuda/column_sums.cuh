// Column sums (fp8kit_column_sums) in the cast+transpose pass, shared by
// the fused delayed-scaling kernels (quantize_fused.cu) and current
// scaling's cast pass (quantize.cu): each block writes its tile's column
// sums to the partials, and the last row tile of each column tile adds
// them up in the order of common/src/column_sums.h.
#ifndef FP8KIT_CUDA_COLUMN_SUMS_CUH_
#define FP8KIT_CUDA_COLUMN_SUMS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "cast_transpose.cuh"
#include "column_sums.h"
#include "fp8kit/column_sums.h"
#include "launch_config.h"

namespace fp8kit {
namespace cuda {

// One tensor's column sums as the kernels see them.
struct SumsJob {
  void* out;
  fp8kit_dtype dtype;
  float* partials;         // [tiles_r, cols]
  unsigned int* counters;  // [tiles_c]
  int64_t tiles_r;
};

inline SumsJob sums_job(const fp8kit_column_sums& s, int64_t rows) {
  return SumsJob{s.sums, s.dtype, s.partials, s.counters, ceil_div(rows, kCtTile)};
}

// The column sums of tile (tile_r, tile_c) of a tensor with `cols`
// columns, in two steps around the caller's last stores:
//   publish_column_sums: the tile's column sums (its 16 group sums added in
//     order) go to the partials, and the tile counts itself done on the
//     column tile's counter (threadfence + atomic). Returns, in thread 0,
//     the count before this tile's (0 in the other threads);
//   finish_column_sums_if_last: the block that counted last adds the
//     partials of every row tile in order, writes the column sums and
//     resets the counter.
// A block that issues its large stores between the two keeps them out of
// the fence, which waits for every store its thread has in flight. The
// order is fp8kit_column_sums's. `col` is the tensor column of this
// thread's tile column (threadIdx.x < 128), >= cols where there is none: a
// tile's columns need not be consecutive (SwiGLU backward's hold both
// halves).
__device__ __forceinline__ unsigned publish_column_sums(const SumsJob& s, int64_t cols,
                                                        int64_t tile_r, int64_t tile_c,
                                                        int64_t col, const GroupSums& group_sums) {
  if (threadIdx.x < kCtTile && col < cols) {
    float sum = 0.0f;
#pragma unroll
    for (int grp = 0; grp < kCtTile / 8; ++grp) {
      sum = add_rn(sum, group_sums[grp][group_sum_slot(grp, threadIdx.x)]);
    }
    s.partials[tile_r * cols + col] = sum;
    __threadfence();  // the partial is visible before the tile counts itself done
  }
  __syncthreads();
  return threadIdx.x == 0 ? atomicAdd(&s.counters[tile_c], 1u) : 0u;
}

__device__ __forceinline__ void finish_column_sums_if_last(const SumsJob& s, int64_t cols,
                                                           int64_t tile_c, int64_t col,
                                                           unsigned counted) {
  __shared__ bool last;
  if (threadIdx.x == 0) last = counted == unsigned(s.tiles_r - 1);
  __syncthreads();
  if (!last) return;
  if (threadIdx.x < kCtTile && col < cols) {
    // The adds are in tile order; the loads (from L2, not a stale L1) are
    // issued kChunk at a time, so the last blocks of the grid wait for
    // tiles_r / kChunk L2 round trips, not tiles_r.
    constexpr int kChunk = 16;
    const float* partial = s.partials + col;
    float total = 0.0f;
    int64_t r = 0;
    for (; r + kChunk <= s.tiles_r; r += kChunk) {
      float v[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = __ldcg(partial + (r + i) * cols);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) total = add_rn(total, v[i]);
    }
    for (; r < s.tiles_r; ++r) total = add_rn(total, __ldcg(partial + r * cols));
    store_rounded(s.out, s.dtype, col, total);
  }
  if (threadIdx.x == 0) s.counters[tile_c] = 0u;
}

// Both steps at once, for a block whose stores are all issued.
__device__ __forceinline__ void finish_column_sums_at(const SumsJob& s, int64_t cols,
                                                      int64_t tile_r, int64_t tile_c, int64_t col,
                                                      const GroupSums& group_sums) {
  const unsigned counted = publish_column_sums(s, cols, tile_r, tile_c, col, group_sums);
  finish_column_sums_if_last(s, cols, tile_c, col, counted);
}

// finish_column_sums_at for cast_transpose_block<..., kSums = true> on tile
// `tile` (row-major over the tiles; tile column c is column tile_c * 128 +
// c).
__device__ __forceinline__ void finish_column_sums(const SumsJob& s, const CastTransposeParams& p,
                                                   int64_t tile, const GroupSums& group_sums) {
  const int64_t tile_c = tile % p.tiles_c;
  finish_column_sums_at(s, p.cols, tile / p.tiles_c, tile_c, tile_c * kCtTile + threadIdx.x,
                        group_sums);
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_COLUMN_SUMS_CUH_
