// fp8kit::cuda::quantize_block_scaling: block-scaled quantization
// (fp8kit/block_scaling.h) in one pass over the input.
//
// One thread block per 128x128 tile of the [rows, cols] input: the tile is
// read once into shared memory (as float32, exact for every input dtype),
// then cast from there into the rowwise copy, the columnwise copy, or both.
// The tile is exactly one 128x128 block, or 128 rowwise 1x128 tiles and 128
// columnwise ones, so every scale is computed inside one thread block and no
// second pass or grid-wide reduction is needed.
//
// Memory access: the tile is read in 16-byte loads, four per thread in
// flight before any is used (a scalar load per element keeps few in flight,
// and this kernel is bound by memory); the amaxes are taken per half line
// (a thread per half of a tile row or column); the casts are written a
// thread per 8 consecutive bytes of a stored row. The tile load and the
// casts give a warp 8 lines x 4 groups of 8 elements (lane % 8 the line,
// lane / 8 the group), so a warp's shared accesses, along rows or down
// columns, fall in 32 distinct banks (see pass_line), and a warp's global
// accesses are 8 rows of 4 groups, whole 32-byte sectors: 32 contiguous
// bytes a row for the casts, 64 or 128 for the load.
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
constexpr int kPitch = kTile + 1;    // floats per shared row: column reads hit distinct banks
constexpr int kThreads = 2 * kTile;  // two threads per tile row or column
constexpr int kHalf = kTile / 2;     // elements per thread of an amax pass (half a line)
constexpr size_t kSmemBytes = size_t(kTile) * kPitch * sizeof(float);

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
// groups, and 2 such rows of warps 16 lines. Element j of a thread's group
// lies in bank (line + 8 * group + j) mod 32 both along a row (line *
// kPitch + 8 * group + j) and down a column ((8 * group + j) * kPitch +
// line), as kPitch = 1 mod 32; a warp's 8 lines and 4 groups make that 32
// distinct banks, where 16 groups of 2 lines would give 4 threads a bank.
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

// Tile elements into shared memory as float32; outside the input: 0, which
// leaves every amax as it is. Each thread loads its group of 8 elements of
// kLoadBatch lines (16-byte loads where p.vector_in) before converting and
// storing them.
constexpr int kLoadBatch = 4;
static_assert(kTile % (kLinesPerPass * kLoadBatch) == 0, "the load takes whole batches");

template <int kIn>
__device__ void load_tile(const BlockCastParams& p, int64_t r0, int64_t c0, float* tile) {
  const int group = pass_group();
  const int64_t c = c0 + group * 8;
  const int valid_cols = int(min(int64_t(8), max(int64_t(0), p.cols - c)));
  for (int line0 = pass_line(); line0 < kTile; line0 += kLinesPerPass * kLoadBatch) {
    Raw8<kIn> raw[kLoadBatch];
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int64_t r = r0 + line0 + b * kLinesPerPass;
      const int valid = r < p.rows ? valid_cols : 0;
      if (valid == 8 && p.vector_in) {
        load_raw8<kIn>(p.in, r * p.cols + c, raw[b]);
      } else {
        load_raw8_partial<kIn>(p.in, r * p.cols + c, valid, raw[b]);
      }
    }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      float* dst = tile + (line0 + b * kLinesPerPass) * kPitch + group * 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = raw_get<kIn>(raw[b], j);
    }
  }
}

// Element k (0..63) of this thread's half line: along a row of the tile
// (rowwise) or down a column (columnwise). A warp's 32 threads take 32
// consecutive lines, the same half: bank (line + k) mod 32 either way, 32
// distinct banks.
template <bool kColumn>
__device__ __forceinline__ float line_at(const float* tile, int line, int half, int k) {
  const int along = half * kHalf + k;
  return kColumn ? tile[along * kPitch + line] : tile[line * kPitch + along];
}

template <bool kColumn>
__device__ uint32_t half_line_amax_bits(const float* tile, int line, int half) {
  uint32_t amax_bits = 0;
#pragma unroll 8
  for (int k = 0; k < kHalf; ++k) {
    const float x = line_at<kColumn>(tile, line, half, k);
    amax_bits = max(amax_bits, __float_as_uint(x) & 0x7fffffffu);
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
template <bool kE4M3, bool kColumn, bool k128x128>
__device__ void cast_copy(const BlockCastParams& p, const float* tile, int64_t r0, int64_t c0,
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
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int along = group * 8 + j;
      const float x = kColumn ? tile[along * kPitch + line] : tile[line * kPitch + along];
      y[j] = __fmul_rn(x, scale);
    }
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

template <int kIn, bool kE4M3, bool k128x128>
__global__ void __launch_bounds__(kThreads) block_cast_kernel(const BlockCastParams p) {
  extern __shared__ float tile[];
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
  // The tile needs more than the default 48 KiB of dynamic shared memory.
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(kSmemBytes)),
             op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
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
