// One 128x128 tile of a block-scaled quantization (fp8kit/block_scaling.h)
// in one pass over the input: cast_tile, the work of one thread block of
// the kernels in quantize_block.cu.
//
// One thread block per 128x128 tile of the [rows, cols] input. The tile is
// exactly one 128x128 block, or 128 rowwise 1x128 tiles and 128 columnwise
// ones, so every scale is computed inside one thread block and no second
// pass or grid-wide reduction is needed.
//
// Each of the 256 threads owns an 8x8 part of the tile (Part) from its
// load to its stores:
// 1. It loads the part's 8 rows and, while they are in registers, folds
//    their |x| into the amax of each of its rows and columns (PartAmax),
//    then parks the raw rows in shared memory (PartStage, block_part.cuh).
// 2. Warp shuffles (max_scatter) and a small shared array combine the
//    parts' amaxes into the tile's 128 row and 128 column amaxes (or the
//    128x128 block's); a thread per line turns its line's amax into the
//    scale, once, and writes scale_inv.
// 3. It reads its rows back and casts them (cast_part): with their rows'
//    scales into the rowwise copy, and with their columns' scales into
//    rows of bytes that a byte transpose in registers turns into runs of
//    8 bytes of the columnwise copy.
// The amaxes thus cost no pass of their own over the tile in shared
// memory, and two __syncthreads (one for 128x128) separate the load from
// the casts. Shared memory only holds the values while the block agrees
// on its scales (registers would take 32 or 64 more a thread, halving the
// blocks an SM holds). No thread reads another's values, so the tile
// needs no layout: each shared access is a warp's 32 consecutive 16-byte
// vectors, 4 wavefronts, the fewest for 512 bytes, along rows and columns
// alike (the transpose is in registers).
//
// Global accesses: a warp takes 8 part rows x 4 part columns, so a load
// reads 8 rows of 64 (bf16, fp16) or 128 (float32) contiguous bytes, a
// rowwise store writes 8 rows of 32 bytes and a columnwise one 4 rows of
// 64: whole 32-byte sectors.
//
// The scale and the cast are the CPU reference's (compute_scale.h, and
// quantize4, which gives fp8_convert.h's quantize_to_fp8), so both give the
// same bits.
#ifndef FP8KIT_CUDA_BLOCK_CAST_TILE_CUH_
#define FP8KIT_CUDA_BLOCK_CAST_TILE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "block_part.cuh"
#include "block_scale_layout.h"
#include "compute_scale.h"
#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {
namespace block_cast {


constexpr int kTile = 128;  // = kBlockLen
constexpr int kParts = kTile / kPart;
constexpr int kThreads = kParts * kParts;
// A warp's parts: kLaneRows part rows (lane % 8) x kLaneCols part columns
// (lane / 8); kColWarps warps side by side across the tile, kRowWarps down.
constexpr int kLaneRows = 8;
constexpr int kLaneCols = 32 / kLaneRows;
constexpr int kColWarps = kParts / kLaneCols;
constexpr int kRowWarps = kParts / kLaneRows;
static_assert(kThreads == 32 * kColWarps * kRowWarps, "a thread per part");

struct BlockCastParams {
  const void* in;
  int64_t rows, cols;
  int64_t tiles_r, tiles_c;
  uint8_t* data;  // rowwise copy [rows, cols] or NULL
  float* scales;  // its block scales
  BlockScaleLayout layout;
  uint8_t* columnwise;  // columnwise copy [cols, rows] or NULL
  float* columnwise_scales;
  BlockScaleLayout columnwise_layout;
  bool vector_in;                       // 16-byte loads of 8 elements are aligned
  bool vector_data, vector_columnwise;  // 8-byte stores are aligned
  float fp8_max;
  float amax_epsilon;
  bool power_2_scale;
};

// This thread's part: tile rows kPart * row .. + 7 and columns kPart * col
// .. + 7, input element (r, c) on; rows x cols of it (0 .. 8 each) lie
// inside the input.
struct Part {
  int row, col;
  int64_t r, c;
  int rows, cols;

  __device__ static Part of(const BlockCastParams& p, int64_t r0, int64_t c0) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    Part part;
    part.row = warp / kColWarps * kLaneRows + lane % kLaneRows;
    part.col = warp % kColWarps * kLaneCols + lane / kLaneRows;
    part.r = r0 + kPart * part.row;
    part.c = c0 + kPart * part.col;
    part.rows = int(min(int64_t(kPart), max(int64_t(0), p.rows - part.r)));
    part.cols = int(min(int64_t(kPart), max(int64_t(0), p.cols - part.c)));
    return part;
  }
};

// Loads this thread's part into `stage`, folding it into `amax` on the way;
// outside the input: 0, which leaves every amax as it is. kLoadBatch rows
// at a time: with 16-byte loads, all in flight before any is used, where
// p.vector_in and the batch lies inside the input, else element by
// element, a row at a time (a batch of those would need more registers
// than kBlocksPerSm leaves).
constexpr int kLoadBatch = 4;
static_assert(kPart % kLoadBatch == 0, "the load takes whole batches");

template <int kIn>
__device__ __forceinline__ void load_part(const BlockCastParams& p, const Part& part,
                                          const PartStage<kIn, kThreads>& stage,
                                          PartAmax<kIn>& amax) {
  const bool vector = p.vector_in && part.cols == kPart;
#pragma unroll
  for (int k0 = 0; k0 < kPart; k0 += kLoadBatch) {
    const int64_t at = (part.r + k0) * p.cols + part.c;
    if (vector && k0 + kLoadBatch <= part.rows) {
      Raw8<kIn> raw[kLoadBatch];
#pragma unroll
      for (int b = 0; b < kLoadBatch; ++b) load_raw8<kIn>(p.in, at + b * p.cols, raw[b]);
#pragma unroll
      for (int b = 0; b < kLoadBatch; ++b) {
        stage.put(k0 + b, raw[b]);
        amax.fold(k0 + b, raw[b]);
      }
    } else {
#pragma unroll
      for (int b = 0; b < kLoadBatch; ++b) {
        Raw8<kIn> raw;
        load_raw8_partial<kIn>(p.in, at + b * p.cols, k0 + b < part.rows ? part.cols : 0, raw);
        stage.put(k0 + b, raw);
        amax.fold(k0 + b, raw);
      }
    }
  }
}

__device__ __forceinline__ float scale_from_amax_bits(const BlockCastParams& p, uint32_t bits) {
  return current_scale_from_amax(__uint_as_float(bits), p.fp8_max, p.amax_epsilon,
                                 p.power_2_scale);
}

// A 1x128 copy's scale_inv of stored row s0 + line, whose tile starts at
// column t0; past the copy's last row, the layout's padding (0).
template <bool kColumn>
__device__ void write_line_scale(const BlockCastParams& p, int64_t s0, int64_t t0, int line,
                                 float scale) {
  float* scales = kColumn ? p.columnwise_scales : p.scales;
  const BlockScaleLayout& layout = kColumn ? p.columnwise_layout : p.layout;
  const int64_t s = s0 + line;
  if (s < (kColumn ? p.cols : p.rows)) {
    scales[layout.index(s, t0)] = reciprocal(scale);
  } else if (s < layout.inner) {
    scales[layout.index(s, t0)] = 0.0f;  // padding of the last tile row
  }
}

// A 128x128 copy's scale_inv of the block at stored (s0, t0), then (last
// block of a scale row) the row's padding; threads 0 .. 3.
template <bool kColumn>
__device__ void write_block_scale(const BlockCastParams& p, int64_t s0, int64_t t0, float scale) {
  if (threadIdx.x >= 4) return;
  float* scales = kColumn ? p.columnwise_scales : p.scales;
  const BlockScaleLayout& layout = kColumn ? p.columnwise_layout : p.layout;
  const int64_t outer = s0 / kTile;
  const int64_t j = t0 / kTile;
  if (threadIdx.x == 0) scales[outer * layout.inner + j] = reciprocal(scale);
  if (j == layout.used_inner - 1) {
    for (int64_t pad = layout.used_inner + threadIdx.x; pad < layout.inner; pad += 4) {
      scales[outer * layout.inner + pad] = 0.0f;
    }
  }
}

// Where a 1x128 tile row's scale lies in shared memory: the rows a warp
// reads at once (row k of 8 parts, kPart apart) in 8 consecutive words.
__device__ __forceinline__ int row_scale_slot(int row) {
  return row % kPart * kParts + row / kPart;
}

// Row k of a part times its scale, as 8 FP8 bytes (.x = elements 0..3);
// kFinite: no infinity to give its code (quantize4).
template <int kIn, bool kE4M3, bool kFinite>
__device__ __forceinline__ uint2 scale_cast8(const Raw8<kIn>& raw, float scale) {
  float x[kPart];
#pragma unroll
  for (int j = 0; j < kPart; ++j) x[j] = raw_get<kIn>(raw, j);
  return quantize8<kE4M3, kFinite>(x, scale);
}

// Elements 4h .. 4h + 3 of row k of a part times their columns' scales,
// as 4 FP8 bytes; kFinite as for scale_cast8.
template <int kIn, bool kE4M3, bool kFinite>
__device__ __forceinline__ uint32_t scale_cast4(const Raw8<kIn>& raw, int h,
                                                const float (&scale)[4]) {
  float x[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = raw_get<kIn>(raw, 4 * h + j);
  return quantize4<kE4M3, kFinite>(x, scale, 0);
}

// 8 FP8 bytes (.x = 0..3) to out[0 .. valid): one 8-byte store where
// `vector` (aligned, valid == 8), else byte by byte.
__device__ __forceinline__ void store8(uint8_t* out, uint2 q, bool vector, int valid) {
  if (vector) {
    *reinterpret_cast<uint2*>(out) = q;
    return;
  }
#pragma unroll
  for (int j = 0; j < kPart; ++j) {
    if (j < valid) out[j] = u2_byte(q, j);
  }
}

// Row k of this thread's part into the rowwise copy.
__device__ __forceinline__ void store_row(const BlockCastParams& p, const Part& part, int k,
                                          uint2 q) {
  store8(p.data + (part.r + k) * p.cols + part.c, q, p.vector_data && part.cols == kPart,
         part.cols);
}

// Columns 4h .. 4h + 3 of this thread's part into the columnwise copy,
// from t[k], their 4 bytes of row k: transposed in registers (4x4 bytes
// twice), each column's 8 bytes are one run of its stored row.
__device__ __forceinline__ void store_columns(const BlockCastParams& p, const Part& part, int h,
                                              const uint32_t (&t)[kPart]) {
  uint32_t a0 = t[0], a1 = t[1], a2 = t[2], a3 = t[3];  // rows 0..3
  uint32_t b0 = t[4], b1 = t[5], b2 = t[6], b3 = t[7];  // rows 4..7
  transpose4x4(a0, a1, a2, a3);
  transpose4x4(b0, b1, b2, b3);
  const uint2 cols[4] = {make_uint2(a0, b0), make_uint2(a1, b1), make_uint2(a2, b2),
                         make_uint2(a3, b3)};
  const bool vector = p.vector_columnwise && part.rows == kPart;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = 4 * h + j;
    if (col < part.cols) {
      store8(p.columnwise + (part.c + col) * p.rows + part.r, cols[j], vector, part.rows);
    }
  }
}

// The casts of this thread's part.
// - 128x128: each row with the block's scale, one cast for both copies
//   (the same bytes).
// - 1x128: two passes over the part's rows, the columnwise copy's columns
//   0..3 with their scales (col_scale), then 4..7; the first pass also
//   casts each row with its scale (row_scale, at row_scale_slot) into the
//   rowwise copy. One pass would hold 8 column scales and 16 registers of
//   bytes to transpose beside the rowwise cast: more than kBlocksPerSm
//   leaves (44 bytes of it spilled).
// kFinite: the casts leave out quantize4's infinity fix-up, so an
// infinite element comes out saturated (see cast_tile).
template <int kIn, bool kE4M3, bool k128x128, bool kFinite>
__device__ void cast_part(const BlockCastParams& p, const Part& part,
                          const PartStage<kIn, kThreads>& stage, float block_scale,
                          const float* row_scale, const float* col_scale) {
  if (part.rows == 0 || part.cols == 0) return;  // outside the input (an edge tile)
  const bool rowwise = p.data != nullptr, columnwise = p.columnwise != nullptr;
  if constexpr (k128x128) {
    uint32_t lo[kPart], hi[kPart];
#pragma unroll
    for (int k = 0; k < kPart; ++k) {
      Raw8<kIn> raw;
      stage.get(k, raw);
      const uint2 q = scale_cast8<kIn, kE4M3, kFinite>(raw, block_scale);
      if (rowwise && k < part.rows) store_row(p, part, k, q);
      lo[k] = q.x;
      hi[k] = q.y;
    }
    if (columnwise) {
      store_columns(p, part, 0, lo);
      store_columns(p, part, 1, hi);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && !columnwise) break;
      float scales[4] = {};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (columnwise) scales[j] = col_scale[kPart * part.col + 4 * h + j];
      }
      uint32_t t[kPart];
#pragma unroll
      for (int k = 0; k < kPart; ++k) {
        Raw8<kIn> raw;
        stage.get(k, raw);
        if (h == 0 && rowwise && k < part.rows) {
          const float scale = row_scale[row_scale_slot(kPart * part.row + k)];
          store_row(p, part, k, scale_cast8<kIn, kE4M3, kFinite>(raw, scale));
        }
        if (columnwise) t[k] = scale_cast4<kIn, kE4M3, kFinite>(raw, h, scales);
      }
      if (columnwise) store_columns(p, part, h, t);
    }
  }
}

// Blocks an SM holds (H100, H200: 228 KiB of shared memory, 1 KiB of it
// reserved a block): 3 with float32 input (64 KiB of parts, 4 KiB of
// amaxes and scales, the reserve: 69 KiB a block), 6 with 16-bit input
// (37 KiB), which leaves 40 registers a thread (6 x 256 x 40 of 64 Ki);
// the kernel is compiled for that many blocks.
template <int kIn>
constexpr int kBlocksPerSm = kIn == FP8KIT_FLOAT32 ? 3 : 6;

// An amax bit pattern (|x|, NaN-propagating) below infinity's: the lines
// it covers hold no infinity (nor a NaN, which would hide one).
__device__ __forceinline__ bool finite_amax(uint32_t bits) { return bits < 0x7f800000u; }

// After a 1x128 tile's finite casts (cast_part<..., kFinite = true>), in
// a tile that holds an infinity: overwrites the byte of each infinite
// element of this thread's part (the same thread's later store wins) with
// fp8_code_of_inf of the element itself, since its lines' amaxes are
// infinite and their scales therefore 1 (current_scale_from_amax). Rare:
// not unrolled over rows, to stay small in registers.
template <int kIn, bool kE4M3>
__device__ void patch_infinities(const BlockCastParams& p, const Part& part,
                                 const PartStage<kIn, kThreads>& stage) {
#pragma unroll 1
  for (int k = 0; k < part.rows; ++k) {
    Raw8<kIn> raw;
    stage.get(k, raw);
#pragma unroll
    for (int j = 0; j < kPart; ++j) {
      const float x = raw_get<kIn>(raw, j);
      if (j >= part.cols || !is_inf_float(x)) continue;
      const uint8_t code = fp8_code_of_inf<kE4M3>(x);
      if (p.data != nullptr) p.data[(part.r + k) * p.cols + part.c + j] = code;
      if (p.columnwise != nullptr) p.columnwise[(part.c + j) * p.rows + part.r + k] = code;
    }
  }
}

// Tile `tile` of p's input (row-major over tiles_c tiles a row), with
// PartStage's bytes of dynamic shared memory at `smem`.
template <int kIn, bool kE4M3, bool k128x128>
__device__ __forceinline__ void cast_tile(const BlockCastParams& p, int64_t tile,
                                          unsigned char* smem) {
  const PartStage<kIn, kThreads> stage(smem);
  const int64_t r0 = (tile / p.tiles_c) * kTile;
  const int64_t c0 = (tile % p.tiles_c) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Part part = Part::of(p, r0, c0);
  PartAmax<kIn> amax;
  load_part<kIn>(p, part, stage, amax);

  if constexpr (k128x128) {
    // The block's amax: per part, per warp, then across warps.
    __shared__ uint32_t warp_amax[kThreads / 32];
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < kPart; ++k) bits = max(bits, amax.row_bits(k));
    bits = __reduce_max_sync(0xffffffffu, bits);
    if (lane == 0) warp_amax[warp] = bits;
    __syncthreads();
    bits = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) bits = max(bits, warp_amax[w]);
    const float scale = scale_from_amax_bits(p, bits);
    if (p.data != nullptr) write_block_scale<false>(p, r0, c0, scale);
    if (p.columnwise != nullptr) write_block_scale<true>(p, c0, r0, scale);
    // The infinity fix-up only where the block holds an infinity (or a
    // NaN), a branch the whole block takes alike; inlined into every cast,
    // its registers cost 3-4% (H100).
    if (finite_amax(bits)) {
      cast_part<kIn, kE4M3, true, true>(p, part, stage, scale, nullptr, nullptr);
    } else {
      cast_part<kIn, kE4M3, true, false>(p, part, stage, scale, nullptr, nullptr);
    }
  } else {
    // Line amaxes: over the warp's parts by max_scatter, then over the
    // warps that share the line (row_part, col_part); a thread per line
    // (rows: threads 0 .. 127, columns: 128 .. 255) makes its scale.
    __shared__ uint32_t row_part[kColWarps][kTile];
    __shared__ uint32_t col_part[kRowWarps][kTile];
    __shared__ float row_scale[kTile], col_scale[kTile];
    if (p.data != nullptr) {
      // The warp's part columns differ in lane bits 3, 4: this lane is
      // left with rows 2 * (lane / 8) + {0, 1} of its part.
      uint32_t v[kPart];
#pragma unroll
      for (int k = 0; k < kPart; ++k) v[k] = amax.row_bits(k);
      max_scatter<kPart, 16, 8>(v);
      const int row = kPart * part.row + 2 * (lane / kLaneRows);
      row_part[warp % kColWarps][row] = v[0];
      row_part[warp % kColWarps][row + 1] = v[1];
    }
    if (p.columnwise != nullptr) {
      // The warp's part rows differ in lane bits 0 .. 2: this lane is left
      // with column lane % 8 of its part.
      uint32_t v[kPart];
#pragma unroll
      for (int j = 0; j < kPart; ++j) v[j] = amax.col_bits(j);
      max_scatter<kPart, 4, 2, 1>(v);
      col_part[warp / kColWarps][kPart * part.col + lane % kLaneRows] = v[0];
    }
    __syncthreads();
    // Every line of the tile is a row line or a column line of a copy that
    // is made, so the tile is finite when each line's amax is.
    bool finite = true;
    const int line = threadIdx.x % kTile;
    if (threadIdx.x < kTile) {
      if (p.data != nullptr) {
        uint32_t bits = 0;
#pragma unroll
        for (int w = 0; w < kColWarps; ++w) bits = max(bits, row_part[w][line]);
        finite = finite_amax(bits);
        const float scale = scale_from_amax_bits(p, bits);
        row_scale[row_scale_slot(line)] = scale;
        write_line_scale<false>(p, r0, c0, line, scale);
      }
    } else if (p.columnwise != nullptr) {
      uint32_t bits = 0;
#pragma unroll
      for (int w = 0; w < kRowWarps; ++w) bits = max(bits, col_part[w][line]);
      finite = finite_amax(bits);
      const float scale = scale_from_amax_bits(p, bits);
      col_scale[line] = scale;
      write_line_scale<true>(p, c0, r0, line, scale);
    }
    // The casts without the infinity fix-up, then patch_infinities where
    // the tile needs it. The fix-up inlined into the casts made this kernel
    // spill 60 bytes a thread under kBlocksPerSm and run 4-8% slower on an
    // H100; a second, fixed-up copy of the casts, as for 128x128, spilled
    // more still.
    finite = __syncthreads_and(finite);
    cast_part<kIn, kE4M3, false, true>(p, part, stage, 1.0f, row_scale, col_scale);
    if (!finite) patch_infinities<kIn, kE4M3>(p, part, stage);
  }
}


}  // namespace block_cast
}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_BLOCK_CAST_TILE_CUH_
