// fp8kit::cuda::quantize_block_scaling: block-scaled quantization
// (fp8kit/block_scaling.h) in one pass over the input.
//
// One thread block per 128x128 tile of the [rows, cols] input: the tile is
// read once into shared memory, then cast from there into the rowwise copy,
// the columnwise copy, or both. The tile is exactly one 128x128 block, or
// 128 rowwise 1x128 tiles and 128 columnwise ones, so every scale is
// computed inside one thread block and no second pass or grid-wide
// reduction is needed.
//
// Shared memory holds float32 input as float32, and bf16 or fp16 input as
// its 16-bit values, widened (exactly) when read: 32 KiB a block instead of
// 64.5, so that an SM holds 6 blocks rather than 3 (kBlocksPerSm) and some
// blocks' loads overlap the others' amaxes and casts.
//
// Memory access: the tile is read in 16-byte loads, four per thread in
// flight before any is used (a scalar load per element keeps few in flight,
// and this kernel is bound by memory); the amaxes are taken per half line
// (a thread per half of a tile row or column); the casts are written a
// thread per 8 consecutive bytes of a stored row. The tile load and the
// casts give a warp 8 lines x 4 groups of 8 elements (lane % 8 the line,
// lane / 8 the group): its global accesses are 8 rows of 4 groups, whole
// 32-byte sectors (32 contiguous bytes a row for the casts, 64 or 128 for
// the load), and the tile's layout (SharedTile: padded rows of float32,
// swizzled 16-byte chunks of 16-bit values) puts its shared accesses, along
// rows or down columns, in distinct banks, as it does an amax warp's.
//
// The scale and the cast are the CPU reference's (compute_scale.h and the
// conversion cvt4 checks against fp8_convert.h), so both give the same bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "block_scale_layout.h"
#include "compute_scale.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch_config.h"
#include "quantize_device.cuh"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kTile = 128;           // = kBlockLen
constexpr int kThreads = 2 * kTile;  // two threads per tile row or column
constexpr int kHalf = kTile / 2;     // elements per thread of an amax pass (half a line)

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

// The tile load and the casts walk the tile in passes of kLinesPerPass
// lines: a warp takes 8 lines x 4 groups of 8 elements (lane % 8 the line,
// lane / 8 the group), the block's 4 warps side by side cover a line's 16
// groups, and 2 such rows of warps 16 lines. (The amax passes give a warp
// 32 consecutive lines, the same half.)
constexpr int kGroupsPerRow = kTile / 8;
constexpr int kWarpLines = 8;
constexpr int kWarpGroups = 32 / kWarpLines;
constexpr int kGroupWarps = kGroupsPerRow / kWarpGroups;  // warps across a line
constexpr int kLinesPerPass = kThreads / 32 / kGroupWarps * kWarpLines;

// This thread's group (elements 8 * group .. + 7 of a line) and its line
// of the first pass.
__device__ __forceinline__ int pass_group() {
  return threadIdx.x / 32 % kGroupWarps * kWarpGroups + threadIdx.x % 32 / kWarpLines;
}
__device__ __forceinline__ int pass_line() {
  return threadIdx.x / 32 / kGroupWarps * kWarpLines + threadIdx.x % kWarpLines;
}

// The tile in shared memory, by input type: row r is input row r0 + r.
// store8 writes group `group` (elements 8 * group .. + 7) of a row from
// the raw input, row8 reads a group of a row as float32, at one element.
template <int kIn, bool k16 = kIn != FP8KIT_FLOAT32>
struct SharedTile;

// float32: rows of kPitch = 129 floats, so element (r, c) lies in bank
// (r + c) mod 32. A pass's warp (8 lines, 4 groups) reads element j of its
// groups in bank (line + 8 * group + j) mod 32 along a row and down a
// column alike: 32 distinct banks (2 lines of 16 groups would give 4
// threads each bank); an amax warp's 32 consecutive lines: 32 too.
template <int kIn>
struct SharedTile<kIn, false> {
  static constexpr int kPitch = kTile + 1;
  static constexpr size_t kBytes = size_t(kTile) * kPitch * sizeof(float);
  float* s;

  __device__ explicit SharedTile(void* smem) : s(static_cast<float*>(smem)) {}
  __device__ void store8(int row, int group, const Raw8<kIn>& raw) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[row * kPitch + group * 8 + j] = raw_get<kIn>(raw, j);
  }
  __device__ void row8(int row, int group, float (&x)[8]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = at(row, group * 8 + j);
  }
  __device__ float at(int row, int col) const { return s[row * kPitch + col]; }
};

// bf16, fp16: the 16-bit values, 256 bytes a row; group g of row r is the
// row's 16-byte chunk g ^ sw(r), sw(r) = (r ^ (r >> 3)) & 7 (so a group
// keeps its 128-byte half of the row). A chunk's bank quad (4 banks, 16
// bytes) is its index mod 8.
// - Row reads and the load's stores take a group in one 16-byte access. A
//   pass's warp has lines 8m .. 8m + 7, where sw is (line ^ m) & 7: the 8
//   threads of each group take the 8 quads, and the warp's 512 bytes the
//   least, 4 wavefronts; the same for an amax warp's 32 lines.
// - Column reads take 2 bytes. Element j of the groups of a pass's warp
//   lies in rows 8 * group + j, sw = (j ^ group) & 7: its 4 groups take 4
//   quads, its 8 columns 4 words of each, 16 banks in all, one wavefront.
//   An amax warp reads 32 columns of one row: 4 chunks 4-aligned, which
//   XOR keeps distinct, 16 banks again.
// No padding does both: a row of 8k elements (16-byte aligned chunks) is
// 4k words, so the rows 8 apart of a column read would share their banks.
template <int kIn>
struct SharedTile<kIn, true> {
  static constexpr size_t kBytes = size_t(kTile) * kTile * sizeof(uint16_t);
  uint4* s;

  __device__ explicit SharedTile(void* smem) : s(static_cast<uint4*>(smem)) {}
  __device__ static int chunk(int row, int group) {
    return row * kGroupsPerRow + (group ^ ((row ^ (row >> 3)) & 7));
  }
  __device__ void store8(int row, int group, const Raw8<kIn>& raw) const {
    s[chunk(row, group)] = raw.v[0];
  }
  __device__ void row8(int row, int group, float (&x)[8]) const {
    Raw8<kIn> raw;
    raw.v[0] = s[chunk(row, group)];
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = raw_get<kIn>(raw, j);
  }
  __device__ float at(int row, int col) const {
    const uint16_t* elements = reinterpret_cast<const uint16_t*>(s + chunk(row, col / 8));
    return bits16_to_float<kIn>(elements[col % 8]);
  }
};

// The tile from the input; outside the input: 0, which leaves every amax
// as it is. Each thread loads its group of 8 elements of kLoadBatch lines
// before storing them: with 16-byte loads where p.vector_in and the batch
// lies inside the input, else element by element, a line at a time (a
// batch of those would need more registers than kBlocksPerSm leaves).
constexpr int kLoadBatch = 4;
static_assert(kTile % (kLinesPerPass * kLoadBatch) == 0, "the load takes whole batches");

template <int kIn>
__device__ void load_tile(const BlockCastParams& p, int64_t r0, int64_t c0,
                          const SharedTile<kIn>& tile) {
  const int group = pass_group();
  const int64_t c = c0 + group * 8;
  const int valid_cols = int(min(int64_t(8), max(int64_t(0), p.cols - c)));
  const bool vector = p.vector_in && valid_cols == 8;
  for (int line0 = pass_line(); line0 < kTile; line0 += kLinesPerPass * kLoadBatch) {
    if (vector && r0 + line0 + (kLoadBatch - 1) * kLinesPerPass < p.rows) {
      Raw8<kIn> raw[kLoadBatch];
#pragma unroll
      for (int b = 0; b < kLoadBatch; ++b) {
        load_raw8<kIn>(p.in, (r0 + line0 + b * kLinesPerPass) * p.cols + c, raw[b]);
      }
#pragma unroll
      for (int b = 0; b < kLoadBatch; ++b) tile.store8(line0 + b * kLinesPerPass, group, raw[b]);
    } else {
#pragma unroll
      for (int b = 0; b < kLoadBatch; ++b) {
        const int64_t r = r0 + line0 + b * kLinesPerPass;
        Raw8<kIn> raw;
        load_raw8_partial<kIn>(p.in, r * p.cols + c, r < p.rows ? valid_cols : 0, raw);
        tile.store8(line0 + b * kLinesPerPass, group, raw);
      }
    }
  }
}

// Elements 8 * group .. + 7 of tile line `line`: along row `line`
// (rowwise) or down column `line` (columnwise).
template <bool kColumn, class Tile>
__device__ __forceinline__ void line8(const Tile& tile, int line, int group, float (&x)[8]) {
  if constexpr (kColumn) {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = tile.at(group * 8 + j, line);
  } else {
    tile.row8(line, group, x);
  }
}

// Largest |x| bit pattern of this thread's half line.
template <bool kColumn, class Tile>
__device__ uint32_t half_line_amax_bits(const Tile& tile, int line, int half) {
  constexpr int kHalfGroups = kHalf / 8;
  uint32_t amax_bits = 0;
  for (int group = half * kHalfGroups; group < (half + 1) * kHalfGroups; ++group) {
    float x[8];
    line8<kColumn>(tile, line, group, x);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax_bits = max(amax_bits, __float_as_uint(x[j]) & 0x7fffffffu);
  }
  return amax_bits;
}

__device__ __forceinline__ float scale_from_amax_bits(const BlockCastParams& p, uint32_t bits) {
  return current_scale_from_amax(__uint_as_float(bits), p.fp8_max, p.amax_epsilon,
                                 p.power_2_scale);
}

// The copy's scale_inv entries for this tile: one per line (1x128, a
// thread per line), or the block's one (128x128), and the layout's padding.
template <bool kColumn, bool k128x128>
__device__ void write_scales(const BlockCastParams& p, int64_t s0, int64_t t0,
                             int64_t stored_rows, float block_scale, const uint32_t* line_amax) {
  float* scales = kColumn ? p.columnwise_scales : p.scales;
  const BlockScaleLayout& layout = kColumn ? p.columnwise_layout : p.layout;
  if constexpr (!k128x128) {
    if (threadIdx.x < kTile) {
      const int64_t s = s0 + threadIdx.x;
      if (s < stored_rows) {
        scales[layout.index(s, t0)] = reciprocal(scale_from_amax_bits(p, line_amax[threadIdx.x]));
      } else if (s < layout.inner) {
        scales[layout.index(s, t0)] = 0.0f;  // padding of the last tile row
      }
    }
  } else if (threadIdx.x < 4) {
    // This block's scale_inv, then (last block of a scale row) the padding.
    const int64_t outer = s0 / kTile;
    const int64_t j = t0 / kTile;
    if (threadIdx.x == 0) scales[outer * layout.inner + j] = reciprocal(block_scale);
    if (j == layout.used_inner - 1) {
      for (int64_t pad = layout.used_inner + threadIdx.x; pad < layout.inner; pad += 4) {
        scales[outer * layout.inner + pad] = 0.0f;
      }
    }
  }
}

// One copy (rowwise: kColumn false) of the tile at (r0, c0). The copy as
// stored is [stored_rows, stored_cols]; tile line `line` (a row, or a column
// for the columnwise copy) is its row s0 + line, from column t0 on. A
// thread casts its group of 8 elements of a line (one 8-byte store), one
// line a pass (see pass_line). `block_scale` is the 128x128 block's scale;
// 1x128 tiles compute theirs from `line_amax`, the line's amax bits.
template <bool kE4M3, bool kColumn, bool k128x128, class Tile>
__device__ void cast_copy(const BlockCastParams& p, const Tile& tile, int64_t r0, int64_t c0,
                          float block_scale, const uint32_t* line_amax) {
  const int64_t stored_rows = kColumn ? p.cols : p.rows;
  const int64_t stored_cols = kColumn ? p.rows : p.cols;
  const int64_t s0 = kColumn ? c0 : r0, t0 = kColumn ? r0 : c0;
  uint8_t* copy = kColumn ? p.columnwise : p.data;
  const int group = pass_group();
  const int64_t t = t0 + group * 8;
  const int valid = int(min(int64_t(8), max(int64_t(0), stored_cols - t)));
  const bool vector = (kColumn ? p.vector_columnwise : p.vector_data) && valid == 8;
  for (int line = pass_line(); line < kTile; line += kLinesPerPass) {
    const int64_t s = s0 + line;
    if (s >= stored_rows || valid == 0) continue;
    const float scale = k128x128 ? block_scale : scale_from_amax_bits(p, line_amax[line]);
    float y[8];
    line8<kColumn>(tile, line, group, y);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = __fmul_rn(y[j], scale);
    const uint2 q = make_uint2(cvt4<kE4M3>(y[0], y[1], y[2], y[3]),
                               cvt4<kE4M3>(y[4], y[5], y[6], y[7]));
    uint8_t* out = copy + s * stored_cols + t;
    if (vector) {
      *reinterpret_cast<uint2*>(out) = q;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (j < valid) out[j] = uint8_t((j < 4 ? q.x : q.y) >> (8 * (j % 4)));
      }
    }
  }
  write_scales<kColumn, k128x128>(p, s0, t0, stored_rows, block_scale, line_amax);
}

// Blocks an SM holds (H100, H200: 228 KiB of shared memory, 1 KiB of it
// reserved a block): 3 with the float32 tile (66.5 KiB a block with the
// amaxes and the reserve), 6 with the 16-bit one (34 KiB), which leaves 40
// registers a thread (6 x 256 x 40 of 64 Ki); the kernel is compiled for
// that many blocks.
template <int kIn>
constexpr int kBlocksPerSm = kIn == FP8KIT_FLOAT32 ? 3 : 6;

template <int kIn, bool kE4M3, bool k128x128>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kIn>)
    block_cast_kernel(const BlockCastParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const SharedTile<kIn> tile(smem);
  __shared__ uint32_t half_amax[2][kTile];  // per half line, then per line in [0]
  __shared__ uint32_t warp_amax[kThreads / 32];
  const int64_t r0 = (int64_t(blockIdx.x) / p.tiles_c) * kTile;
  const int64_t c0 = (int64_t(blockIdx.x) % p.tiles_c) * kTile;
  const int line = threadIdx.x % kTile, half = threadIdx.x / kTile;
  load_tile<kIn>(p, r0, c0, tile);
  __syncthreads();

  float block_scale = 1.0f;
  if constexpr (k128x128) {
    // max |x| of the whole block: per half row, per warp, then across warps.
    uint32_t bits = half_line_amax_bits<false>(tile, line, half);
    for (int offset = 16; offset > 0; offset /= 2) {
      bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
    }
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = bits;
    __syncthreads();
    bits = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) bits = max(bits, warp_amax[w]);
    block_scale = scale_from_amax_bits(p, bits);
  }
  if (p.data != nullptr) {
    if constexpr (!k128x128) {
      half_amax[half][line] = half_line_amax_bits<false>(tile, line, half);
      __syncthreads();
      if (half == 0) half_amax[0][line] = max(half_amax[0][line], half_amax[1][line]);
      __syncthreads();
    }
    cast_copy<kE4M3, false, k128x128>(p, tile, r0, c0, block_scale, half_amax[0]);
    __syncthreads();  // half_amax is reused below
  }
  if (p.columnwise != nullptr) {
    if constexpr (!k128x128) {
      half_amax[half][line] = half_line_amax_bits<true>(tile, line, half);
      __syncthreads();
      if (half == 0) half_amax[0][line] = max(half_amax[0][line], half_amax[1][line]);
      __syncthreads();
    }
    cast_copy<kE4M3, true, k128x128>(p, tile, r0, c0, block_scale, half_amax[0]);
  }
}

template <int kIn, bool kE4M3, bool k128x128>
void launch_typed(const BlockCastParams& p, cudaStream_t stream, const char* op) {
  auto* kernel = block_cast_kernel<kIn, kE4M3, k128x128>;
  constexpr size_t kSmemBytes = SharedTile<kIn>::kBytes;
  if constexpr (kSmemBytes > 48 * 1024) {
    // The float32 tile needs more than the default 48 KiB of dynamic shared memory.
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kSmemBytes)),
               op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  }
  kernel<<<unsigned(p.tiles_r * p.tiles_c), kThreads, kSmemBytes, stream>>>(p);
  check_launch(op, "launching the block-scaled cast kernel");
}

template <int kIn>
void launch_for_input(const BlockCastParams& p, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                      cudaStream_t stream, const char* op) {
  const bool blocks = mode == FP8KIT_SCALING_BLOCK_128X128;
  if (fp8 == FP8KIT_E4M3) {
    blocks ? launch_typed<kIn, true, true>(p, stream, op)
           : launch_typed<kIn, true, false>(p, stream, op);
  } else {
    blocks ? launch_typed<kIn, false, true>(p, stream, op)
           : launch_typed<kIn, false, false>(p, stream, op);
  }
}

}  // namespace

void quantize_block_scaling(const fp8kit_tensor& input, fp8kit_tensor& output,
                            const fp8kit_current_scaling_config& config, void* stream_ptr) {
  const char* op = "quantize_block_scaling";
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  if (rows == 0 || cols == 0) return;
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  BlockCastParams p;
  p.in = input.data;
  p.rows = rows;
  p.cols = cols;
  p.tiles_r = ceil_div(rows, kTile);
  p.tiles_c = ceil_div(cols, kTile);
  p.data = static_cast<uint8_t*>(output.data);
  p.scales = output.block_scale_inv;
  p.layout = BlockScaleLayout::of(output.scaling_mode, rows, cols);
  p.columnwise = static_cast<uint8_t*>(output.columnwise_data);
  p.columnwise_scales = output.columnwise_block_scale_inv;
  p.columnwise_layout = BlockScaleLayout::of(output.scaling_mode, cols, rows);
  p.vector_in = cols % 8 == 0 && is_aligned(input.data, 16);
  p.vector_data = cols % 8 == 0 && is_aligned(output.data, 8);
  p.vector_columnwise = rows % 8 == 0 && is_aligned(output.columnwise_data, 8);
  p.fp8_max = fp8kit_fp8_max(output.dtype);
  p.amax_epsilon = config.amax_epsilon;
  p.power_2_scale = config.power_2_scale != 0;
  switch (input.dtype) {
    case FP8KIT_FLOAT32:
      launch_for_input<FP8KIT_FLOAT32>(p, output.dtype, output.scaling_mode, stream, op);
      break;
    case FP8KIT_BFLOAT16:
      launch_for_input<FP8KIT_BFLOAT16>(p, output.dtype, output.scaling_mode, stream, op);
      break;
    default:
      launch_for_input<FP8KIT_FLOAT16>(p, output.dtype, output.scaling_mode, stream, op);
      break;
  }
}

}  // namespace cuda
}  // namespace fp8kit
