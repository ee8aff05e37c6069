// The fused cast+transpose kernel: one pass over a [rows, cols] input that
// writes the columnwise (transposed, [cols, rows]) FP8 copy, optionally the
// rowwise copy, and the amax.
//
// Work split: a block of 256 threads owns a 128x128 tile; each thread owns
// an 8x8 micro-tile (8 rows of 8 consecutive elements):
//   1. load: 8 rows x one 16-byte vector (two for float32); 8 lanes cover a
//      128-byte row segment, so a warp instruction reads four full rows of
//      128 bytes. Every load of the tile is in flight before any use.
//   2. cast: scale, convert to FP8 (8 bytes per row), fold |x| into amax.
//   3. rowwise: one 8-byte store per row (a warp writes four 64-byte row
//      segments per instruction).
//   4. columnwise: transpose the 8x8 bytes in registers (byte_perm), park
//      the 8-byte column pieces in shared memory, and read them back as
//      16-byte pieces of 16 consecutive input rows, so each output row of
//      the tile (128 bytes) is written by 8 lanes with 16-byte stores.
//      The shared-memory layout is XOR-swizzled so that both the 8-byte
//      writes and the 16-byte reads are free of bank conflicts (see
//      slot_of below).
//   5. amax: warp max (redux), block max, one atomicMax per block.
// Tiles on the right or bottom border (or shapes whose rows are not
// 16-byte aligned) take predicated loads and stores; interior tiles of
// aligned shapes take the vector path.
#ifndef FP8KIT_CUDA_CAST_TRANSPOSE_CUH_
#define FP8KIT_CUDA_CAST_TRANSPOSE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {

constexpr int kCtTile = 128;     // tile rows = tile cols
constexpr int kCtThreads = 256;  // 16 x 16 micro-tiles of 8x8
constexpr int kCtWarps = kCtThreads / 32;

struct CastTransposeParams {
  const void* in;        // [rows, cols] float32/bfloat16/float16
  uint8_t* out;          // rowwise [rows, cols] or NULL
  uint8_t* columnwise;   // [cols, rows]
  float* amax;           // atomicMax target (zeroed) or NULL
  ScaleSource scale;
  int64_t rows, cols;
  int64_t tiles_c;       // tiles along cols
  bool in_vec;           // cols % 8 == 0 and `in` 16-byte aligned: vector loads
  bool out_vec;          // cols % 8 == 0 and `out` 8-byte aligned: vector stores
  int columnwise_align;  // 16, 8 or 1: usable alignment of columnwise row pieces
};

// Shared-memory slot of (column c of the tile, row group g = row / 8): the
// tile's columns are 128-byte lines of 16 eight-byte slots, and the slot
// index is g XOR 2 * ((c / 8) % 8). Writes: a half-warp is 8 column groups
// x 2 row groups (g even, g+1), all with the same c % 8, so the 16 lanes
// hit 16 distinct slots of one 128-byte line position. Reads: slots 2m and
// 2m+1 (row groups 2m, 2m+1) stay adjacent and 16-byte aligned because the
// XOR key is even; a quarter-warp reads one column's 8 pairs, distinct.
__device__ __forceinline__ int slot_of(int c, int g) { return g ^ (2 * ((c >> 3) & 7)); }

// Up to 16 bytes of one columnwise row piece; `count` valid, alignment
// `align` (16, 8 or 1) of dst.
__device__ __forceinline__ void store_columnwise_piece(uint8_t* dst, const uint4& v,
                                                       int count, int align) {
  if (count >= 16 && align == 16) {
    *reinterpret_cast<uint4*>(dst) = v;
    return;
  }
  if (align >= 8) {
    if (count >= 8) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(v.x, v.y);
    }
    if (count >= 16) {
      *reinterpret_cast<uint2*>(dst + 8) = make_uint2(v.z, v.w);
      return;
    }
    const int start = count >= 8 ? 8 : 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (i >= start && i < count) dst[i] = u4_byte(v, i);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (i < count) dst[i] = u4_byte(v, i);
  }
}

// Rows of a tile summed per column in the order of fp8kit_column_sums
// (common/src/column_sums.h): group_sums[g][group_sum_slot(g, c)] is the
// float32 sum, in row order, of the 8 rows of group g in tile column c.
using GroupSums = float[kCtTile / 8][kCtTile];

// Where column c of row group g sits: c with its low 3 bits XOR-swizzled,
// so that neither access is a bank conflict. Writes (one column j of 8 per
// thread, a warp = 8 column groups x 4 row groups): the unswizzled c = 8 cg
// + j puts 8 lanes on each of 4 banks; the swizzle spreads a warp's 32 lanes
// over 32 banks. Reads (finish_column_sums: a warp = 32 consecutive columns
// of one group) stay on 32 distinct banks, the swizzle being a permutation
// within each 8 columns.
__device__ __forceinline__ int group_sum_slot(int g, int c) {
  return c ^ ((((c >> 5) & 1) << 2) | (g & 3));
}

// Tile `tile` (row-major over the tiles) of the tensor: the whole work of
// one block. Shared by the one-tensor kernel below and the grouped kernels
// of quantize_fused.cu. With kSums it also fills `group_sums` (shared
// memory), complete after the function's internal __syncthreads.
template <int kIn, bool kE4M3, bool kRowwise, bool kSums = false>
__device__ __forceinline__ void cast_transpose_block(const CastTransposeParams& p, int64_t tile,
                                                     GroupSums* group_sums = nullptr) {
  __shared__ __align__(16) uint4 tile_columnwise[kCtTile * 8];  // [128 cols][16 slots of 8 B]
  __shared__ uint32_t warp_max[kCtWarps];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int cg = (lane & 7) + 8 * (warp & 1);  // column group 0..15
  const int rg = 4 * (warp >> 1) + (lane >> 3);  // row group 0..15

  const int64_t tile_r0 = (tile / p.tiles_c) * kCtTile;
  const int64_t tile_c0 = (tile % p.tiles_c) * kCtTile;
  const bool full = tile_r0 + kCtTile <= p.rows && tile_c0 + kCtTile <= p.cols;

  const int64_t r0 = tile_r0 + rg * 8;  // this thread's first row
  const int64_t c0 = tile_c0 + cg * 8;  // and first column
  // Columns of this thread's 8 that exist (0 when c0 is past the end).
  const int valid_c = p.cols - c0 >= 8 ? 8 : (p.cols > c0 ? int(p.cols - c0) : 0);

  // 1. Load.
  Raw8<kIn> raw[8];
  if (full && p.in_vec) {
#pragma unroll
    for (int k = 0; k < 8; ++k) load_raw8<kIn>(p.in, (r0 + k) * p.cols + c0, raw[k]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const bool row_ok = r0 + k < p.rows;
      if (row_ok && valid_c == 8 && p.in_vec) {
        load_raw8<kIn>(p.in, (r0 + k) * p.cols + c0, raw[k]);
      } else {
        load_raw8_partial<kIn>(p.in, (r0 + k) * p.cols + c0, row_ok ? valid_c : 0, raw[k]);
      }
    }
  }

  // 2. Cast (absent elements are 0: they leave amax alone and are never
  // stored).
  const float scale = read_scale(p.scale, tile == 0);
  uint32_t amax_bits = 0;
  uint2 q[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) q[k] = cast8<kIn, kE4M3>(raw[k], scale, amax_bits);

  // 2b. Column sums of this thread's 8 rows (absent elements are 0).
  if constexpr (kSums) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) sum = __fadd_rn(sum, raw_get<kIn>(raw[k], j));
      (*group_sums)[rg][group_sum_slot(rg, cg * 8 + j)] = sum;
    }
  }

  // 3. Rowwise stores.
  if constexpr (kRowwise) {
    if (full && p.out_vec) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        *reinterpret_cast<uint2*>(p.out + (r0 + k) * p.cols + c0) = q[k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (r0 + k >= p.rows) continue;
        uint8_t* dst = p.out + (r0 + k) * p.cols + c0;
        if (valid_c == 8 && p.out_vec) {
          *reinterpret_cast<uint2*>(dst) = q[k];
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (j < valid_c) dst[j] = u2_byte(q[k], j);
          }
        }
      }
    }
  }

  // 4. Columnwise: registers -> shared (swizzled) -> 16-byte row pieces.
  uint2 q_columnwise[8];
  transpose8x8(q, q_columnwise);
  uint2* tile_columnwise8 = reinterpret_cast<uint2*>(tile_columnwise);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int c = cg * 8 + j;
    tile_columnwise8[c * 16 + slot_of(c, rg)] = q_columnwise[j];
  }
  amax_block_publish(amax_bits, warp_max);
  __syncthreads();

#pragma unroll
  for (int it = 0; it < (kCtTile * 8) / kCtThreads; ++it) {
    const int id = it * kCtThreads + tid;
    const int c = id >> 3;  // tile column = output row
    const int m = id & 7;   // 16-row piece: row groups 2m, 2m+1
    // slot_of(c, 2m) = 2 * (m ^ ((c >> 3) & 7)): a 16-byte aligned pair.
    const uint4 v = tile_columnwise[c * 8 + (m ^ ((c >> 3) & 7))];
    const int64_t oc = tile_c0 + c;
    const int64_t orow0 = tile_r0 + 16 * m;
    uint8_t* dst = p.columnwise + oc * p.rows + orow0;
    if (full && p.columnwise_align == 16) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else if (oc < p.cols && orow0 < p.rows) {
      const int64_t left = p.rows - orow0;
      store_columnwise_piece(dst, v, left >= 16 ? 16 : int(left), p.columnwise_align);
    }
  }

  // 5. Amax.
  if (p.amax != nullptr) amax_block_commit<kCtWarps>(warp_max, p.amax);
}

template <int kIn, bool kE4M3, bool kRowwise>
__global__ void __launch_bounds__(kCtThreads, kIn == FP8KIT_FLOAT32 ? 2 : 4)
    cast_transpose_kernel(const CastTransposeParams p) {
  cast_transpose_block<kIn, kE4M3, kRowwise>(p, blockIdx.x);
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_CAST_TRANSPOSE_CUH_
