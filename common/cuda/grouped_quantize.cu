// fp8kit::cuda::grouped_quantize and grouped_quantize_delayed_update:
// per-group per-tensor quantization of a token-grouped tensor
// (fp8kit/grouped.h), every group in the same launch.
//
// Launch sequence on the caller's stream, no allocation:
//   current scaling: zero amax -> amax kernel -> scales kernel -> cast kernel
//   given scales:    [zero amax] -> cast kernel (amax when asked) -> scales kernel
//   delayed scaling: zero amax -> [amax kernel, fresh groups only] ->
//                    delayed scales kernel (the scale used) -> cast kernel
//                    (amax) -> update kernel (history, scale, seeded)
// then, for a columnwise copy, the pad kernel (each block's zero columns)
// and a fill of the buffer's unused tail.
//
// The kernels work on 64x64 tiles of the input (grouped_tile.cuh). The
// cast is quantize_to_fp8 with the group's scale, bit-identical to the CPU
// reference; the scales use compute_scale.h's rules as the per-tensor
// kernels do.
#include <cuda_runtime.h>

#include <cstdint>

#include "compute_scale.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "delayed_update_device.cuh"
#include "error.h"
#include "fp8_convert.h"
#include "fp8kit/grouped.h"
#include "grouped_tile.cuh"
#include "launch_config.h"
#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {
namespace {

using namespace grouped_tile;  // NOLINT: this file's kernels are built of its tiles

constexpr const char* kOp = "grouped_quantize";
constexpr int kUpdateThreads = 128;  // the update's history roll

template <int kIn, bool kVec>
__global__ void __launch_bounds__(kThreads) amax_kernel(const Params p) {
  __shared__ TileGroups t;
  __shared__ uint32_t tile_amax[kTile];
  const int64_t row0 = tile_row0();
  const int64_t col = tile_col0() + int64_t(threadIdx.x % kChunksPerRow) * kChunk;
  if (threadIdx.x < kTile) tile_amax[threadIdx.x] = 0;
  find_tile_groups(p, row0, t);
  __syncthreads();
  // Rows not to measure get group -1; a tile with none to measure reads
  // nothing (after a delayed layer's first step, every tile).
  bool measure = false;
  if (threadIdx.x < kTile) {
    const int g = t.row_group[threadIdx.x];
    measure = g >= 0 && (p.seeded == nullptr || p.seeded[g * kStride] == 0.0f);
    if (!measure) t.row_group[threadIdx.x] = -1;
  }
  if (!__syncthreads_or(measure)) return;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int tr = int(threadIdx.x / kChunksPerRow) + pass * kRowsPerPass;
    uint32_t bits = 0;
    if (col < p.features && t.row_group[tr] >= 0) {
      Raw8<kIn> raw;
      load_chunk<kIn, kVec>(p, row0 + tr, col, raw);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        bits = max(bits, __float_as_uint(raw_get<kIn>(raw, j)) & 0x7fffffffu);
      }
    }
    fold_row_amax(bits, tr, t, tile_amax);
  }
  flush_tile_amax(p, t, tile_amax);
}

// The transposed stores of a cast tile (tile[row][column], its rows'
// groups in t): each thread takes 4 consecutive rows of a column, which
// are 4 consecutive bytes of their group's block, so a warp writes 16 runs
// of 4 bytes of one column, 64 bytes, and 64 of the next. Where the 4 rows
// are one group's and start at a multiple of 4 of its tokens (the block
// and its columns begin at multiples of 16 bytes past the copy's start),
// one 4-byte store; else a byte per row.
constexpr int kQuad = 4;
constexpr int kQuadsPerColumn = kTile / kQuad;               // 16
constexpr int kColumnsPerPass = kThreads / kQuadsPerColumn;  // 16

__device__ __forceinline__ uint8_t* columnwise_at(const Params& p, int g, int64_t r,
                                                  int64_t c) {
  const int64_t padded = p.groups.column_start[g + 1] - p.groups.column_start[g];
  return p.columnwise + p.features * int64_t(p.groups.column_start[g]) + c * padded +
         (r - p.groups.start[g]);
}

__device__ void store_columnwise(const Params& p, const TileGroups& t,
                                 const uint8_t (&tile)[kTile][kTile + 4], int64_t row0,
                                 int64_t col0) {
  const int tr = int(threadIdx.x % kQuadsPerColumn) * kQuad;
  const int64_t r = row0 + tr;
  if (r >= p.rows) return;
  const int g = t.row_group[tr];
  const bool whole = r + kQuad <= p.rows && t.row_group[tr + kQuad - 1] == g &&
                     (r - p.groups.start[g]) % kQuad == 0 &&
                     reinterpret_cast<uintptr_t>(p.columnwise) % kQuad == 0;
#pragma unroll
  for (int i = 0; i < kTile / kColumnsPerPass; ++i) {
    const int tc = int(threadIdx.x / kQuadsPerColumn) + i * kColumnsPerPass;
    const int64_t c = col0 + tc;
    if (c >= p.features) break;
    if (whole) {
      const uint32_t bytes = uint32_t(tile[tr][tc]) | uint32_t(tile[tr + 1][tc]) << 8 |
                             uint32_t(tile[tr + 2][tc]) << 16 | uint32_t(tile[tr + 3][tc]) << 24;
      *reinterpret_cast<uint32_t*>(columnwise_at(p, g, r, c)) = bytes;
    } else {
      for (int k = 0; k < kQuad && r + k < p.rows; ++k) {
        *columnwise_at(p, t.row_group[tr + k], r + k, c) = tile[tr + k][tc];
      }
    }
  }
}

// The cast of a 64x64 tile: each thread casts 8 consecutive elements of
// two rows with 16-byte loads and an 8-byte rowwise store, and leaves its
// bytes in shared memory for the transposed stores of the columnwise copy.
// The loads go out first: they need no group, so their latency overlaps
// the lookup of the tile's groups and scales. A tile is small; with its
// loads issued after that lookup, the cast moved 2.3-2.5 TB/s on an H200,
// about half the bandwidth.
template <int kIn, bool kE4M3, bool kVec>
__global__ void __launch_bounds__(kThreads) cast_kernel(const Params p) {
  __shared__ TileGroups t;
  __shared__ float row_scale[kTile];
  __shared__ uint32_t tile_amax[kTile];
  // Rows 68 bytes apart (17 words): the transposed reads below fall in
  // at most two ways of a bank.
  __shared__ __align__(16) uint8_t tile[kTile][kTile + 4];
  const int64_t row0 = tile_row0(), col0 = tile_col0();
  const int tc = int(threadIdx.x % kChunksPerRow) * kChunk;
  const int64_t col = col0 + tc;
  Raw8<kIn> raw[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int64_t r = row0 + int(threadIdx.x / kChunksPerRow) + pass * kRowsPerPass;
    if (r < p.rows && col < p.features) load_chunk<kIn, kVec>(p, r, col, raw[pass]);
  }
  if (threadIdx.x < kTile) tile_amax[threadIdx.x] = 0;
  find_tile_groups(p, row0, t);
  __syncthreads();
  if (threadIdx.x < kTile && t.row_group[threadIdx.x] >= 0) {
    row_scale[threadIdx.x] = checked_scale(p.scale[t.row_group[threadIdx.x] * kStride]);
  }
  __syncthreads();
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int tr = int(threadIdx.x / kChunksPerRow) + pass * kRowsPerPass;
    const int64_t r = row0 + tr;
    uint32_t bits = 0;
    if (r < p.rows && col < p.features) {
      const uint2 q = cast8<kIn, kE4M3>(raw[pass], row_scale[tr], bits);
      if (p.data != nullptr) {
        uint8_t* out = p.data + r * p.features + col;
        if (kVec) {
          *reinterpret_cast<uint2*>(out) = q;
        } else {
          for (int j = 0; j < kChunk && col + j < p.features; ++j) out[j] = u2_byte(q, j);
        }
      }
      *reinterpret_cast<uint32_t*>(&tile[tr][tc]) = q.x;
      *reinterpret_cast<uint32_t*>(&tile[tr][tc + 4]) = q.y;
    }
    if (p.amax != nullptr) fold_row_amax(bits, tr, t, tile_amax);
  }
  if (p.amax != nullptr) flush_tile_amax(p, t, tile_amax);
  if (p.columnwise == nullptr) return;
  __syncthreads();
  store_columnwise(p, t, tile, row0, col0);
}

// One thread per group: the scale (current scaling) and scale_inv, and the
// amax's NaN written as the canonical NaN, as the CPU reference writes it.
__global__ void scales_kernel(const Params p, bool current, float fp8_max, float epsilon,
                              bool power_2_scale) {
  const int g = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= p.groups.count) return;
  const int s = g * kStride;
  float amax = 0.0f;
  if (p.amax != nullptr) {
    amax = is_nan_float(p.amax[s]) ? canonical_nan() : p.amax[s];
    p.amax[s] = amax;
  }
  float scale = checked_scale(p.scale[s]);
  if (current) {
    scale = current_scale_from_amax(amax, fp8_max, epsilon, power_2_scale);
    p.scale[s] = scale;
  }
  p.scale_inv[s] = reciprocal(scale);
}

// Delayed scaling, one thread per group: the scale used (a fresh group's
// seed from the amax the amax kernel measured, by the update's rule) into
// p.scale, for the cast, and its reciprocal.
__global__ void delayed_scales_kernel(const Params p, const float* state_scale,
                                      const float* seeded, float fp8_max, int margin) {
  const int g = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= p.groups.count) return;
  const int s = g * kStride;
  const float previous = state_scale[s];
  const bool fresh = seeded != nullptr && seeded[s] == 0.0f;
  const float used = checked_scale(
      fresh ? delayed_scale_from_amax(p.amax[s], previous, fp8_max, margin) : previous);
  p.scale[s] = used;
  p.scale_inv[s] = reciprocal(used);
}

struct DelayedUpdate {
  float* amax_history;  // [E, len]
  float* scale;
  float* seeded;        // or NULL
  int len, margin;
  bool most_recent, record;
  float fp8_max;
};

// One block per group, after the cast: the amax's NaN made canonical (as
// the CPU reference writes it) and, when recording, the update of
// delayed_scaling.cu's kernel with the scale used as the previous scale.
__global__ void __launch_bounds__(kUpdateThreads)
    delayed_update_kernel(const Params p, const DelayedUpdate u) {
  const int g = int(blockIdx.x);
  const int s = g * kStride;
  const float amax = is_nan_float(p.amax[s]) ? canonical_nan() : p.amax[s];
  if (u.record) {
    // Every thread has read the amax, which lies outside the history.
    const float r = roll_history_and_reduce(u.amax_history + int64_t(g) * u.len, u.len, amax,
                                            u.most_recent);
    if (threadIdx.x == 0) {
      u.scale[s] = delayed_scale_from_amax(r, p.scale[s], u.fp8_max, u.margin);
      if (u.seeded != nullptr) u.seeded[s] = 1.0f;
    }
  }
  if (threadIdx.x == 0) p.amax[s] = amax;
}

// Zeroes the padding columns [m_g, p_g) of every feature row of group
// blockIdx.x's block.
__global__ void pad_kernel(const Params p) {
  const int g = int(blockIdx.x);
  const int64_t m = p.groups.start[g + 1] - p.groups.start[g];
  const int64_t padded = p.groups.column_start[g + 1] - p.groups.column_start[g];
  const int64_t pad = padded - m;
  if (pad == 0) return;
  uint8_t* block = p.columnwise + p.features * int64_t(p.groups.column_start[g]);
  for (int64_t i = threadIdx.x; i < p.features * pad; i += blockDim.x) {
    block[(i / pad) * padded + m + i % pad] = 0;
  }
}

// Whole 16-byte loads and 8-byte rowwise stores: rows of a multiple of 8
// elements, input and rowwise output aligned to match.
bool vector_rows(const Params& p) {
  auto aligned = [](const void* ptr, uintptr_t to) {
    return reinterpret_cast<uintptr_t>(ptr) % to == 0;
  };
  return p.features % kChunk == 0 && aligned(p.input, 16) &&
         (p.data == nullptr || aligned(p.data, 8));
}

template <int kIn, bool kVec>
void launch_cast(const Params& p, dim3 grid, fp8kit_dtype fp8, cudaStream_t stream) {
  if (fp8 == FP8KIT_E4M3) {
    cast_kernel<kIn, true, kVec><<<grid, kThreads, 0, stream>>>(p);
  } else {
    cast_kernel<kIn, false, kVec><<<grid, kThreads, 0, stream>>>(p);
  }
  check_launch(kOp, "launching the grouped cast kernel");
}

template <int kIn>
void launch_cast(const Params& p, dim3 grid, fp8kit_dtype fp8, cudaStream_t stream) {
  if (vector_rows(p)) launch_cast<kIn, true>(p, grid, fp8, stream);
  else launch_cast<kIn, false>(p, grid, fp8, stream);
}

void launch_cast(const Params& p, dim3 grid, fp8kit_dtype in, fp8kit_dtype fp8,
                 cudaStream_t s) {
  if (p.rows == 0) return;
  if (in == FP8KIT_FLOAT32) launch_cast<FP8KIT_FLOAT32>(p, grid, fp8, s);
  else if (in == FP8KIT_BFLOAT16) launch_cast<FP8KIT_BFLOAT16>(p, grid, fp8, s);
  else launch_cast<FP8KIT_FLOAT16>(p, grid, fp8, s);
}

template <int kIn>
void launch_amax(const Params& p, dim3 grid, cudaStream_t s) {
  if (vector_rows(p)) amax_kernel<kIn, true><<<grid, kThreads, 0, s>>>(p);
  else amax_kernel<kIn, false><<<grid, kThreads, 0, s>>>(p);
  check_launch(kOp, "launching the grouped amax kernel");
}

void launch_amax(const Params& p, dim3 grid, fp8kit_dtype in, cudaStream_t s) {
  if (p.rows == 0) return;
  if (in == FP8KIT_FLOAT32) launch_amax<FP8KIT_FLOAT32>(p, grid, s);
  else if (in == FP8KIT_BFLOAT16) launch_amax<FP8KIT_BFLOAT16>(p, grid, s);
  else launch_amax<FP8KIT_FLOAT16>(p, grid, s);
}

// The kernels' view of the call; output's amax zeroed for their atomicMax.
Params make_params(const fp8kit_tensor& input, const GroupLayout& layout,
                   fp8kit_tensor& output, void* stream) {
  FP8KIT_CHECK(layout.column_tokens < (int64_t(1) << 31), kOp, ": ", layout.tokens,
               " tokens in ", layout.groups(), " groups exceed the CUDA kernels' 2^31-row "
               "index; split the batch");
  FP8KIT_CHECK(ceil_div(input.shape[1], kTile) <= 65535, kOp, ": ", input.shape[1],
               " features exceed the CUDA kernels' 65535 column tiles of ", kTile);
  Params p{};
  p.input = input.data;
  p.rows = input.shape[0];
  p.features = input.shape[1];
  p.data = static_cast<uint8_t*>(output.data);
  p.columnwise = static_cast<uint8_t*>(output.columnwise_data);
  p.scale = output.scale;
  p.scale_inv = output.scale_inv;
  p.amax = output.amax;
  p.groups.count = int(layout.groups());
  for (int64_t g = 0; g <= layout.groups(); ++g) {
    p.groups.start[g] = int32_t(layout.starts[g]);
    p.groups.column_start[g] = int32_t(layout.column_starts[g]);
  }
  if (p.amax != nullptr) {
    zero_bytes(input.device_index, p.amax, size_t(layout.groups()) * kStride * sizeof(float),
               stream);
  }
  return p;
}

// Row tiles along x (up to 2^31 - 1 blocks), column tiles along y.
dim3 tile_grid(const Params& p) {
  return dim3(unsigned(ceil_div(p.rows, kTile)), unsigned(ceil_div(p.features, kTile)));
}

unsigned group_blocks(const GroupLayout& layout) {
  return unsigned(ceil_div(layout.groups(), 128));
}

// The columnwise copy's padding columns and unused tail, zeroed.
void finish_columnwise(const Params& p, const GroupLayout& layout, int device_index,
                       cudaStream_t s) {
  if (p.columnwise == nullptr) return;
  pad_kernel<<<unsigned(layout.groups()), kThreads, 0, s>>>(p);
  check_launch(kOp, "launching the grouped pad kernel");
  const int64_t used = p.features * layout.column_starts[layout.groups()];
  const int64_t capacity = p.features * layout.column_tokens;
  if (capacity > used) zero_bytes(device_index, p.columnwise + used, size_t(capacity - used), s);
}

}  // namespace

void grouped_quantize(const fp8kit_tensor& input, const GroupLayout& layout, fp8kit_tensor& output,
                      const fp8kit_current_scaling_config* current, void* stream) {
  ScopedDevice device(input.device_index, kOp);
  const auto s = static_cast<cudaStream_t>(stream);
  const Params p = make_params(input, layout, output, stream);
  const dim3 grid = tile_grid(p);
  const float fp8_max = fp8kit_fp8_max(output.dtype);
  const float epsilon = current ? current->amax_epsilon : 0.0f;
  const bool pow2 = current && current->power_2_scale != 0;
  if (current != nullptr) {
    launch_amax(p, grid, input.dtype, s);
    scales_kernel<<<group_blocks(layout), 128, 0, s>>>(p, true, fp8_max, epsilon, pow2);
    check_launch(kOp, "launching the grouped scales kernel");
  }
  Params cast = p;
  if (current != nullptr) cast.amax = nullptr;  // measured by the amax pass
  launch_cast(cast, grid, input.dtype, output.dtype, s);
  if (current == nullptr) {
    scales_kernel<<<group_blocks(layout), 128, 0, s>>>(p, false, fp8_max, epsilon, pow2);
    check_launch(kOp, "launching the grouped scales kernel");
  }
  finish_columnwise(p, layout, input.device_index, s);
}

void grouped_quantize_delayed_update(const fp8kit_tensor& input, const GroupLayout& layout,
                                     fp8kit_tensor& output,
                                     const fp8kit_grouped_delayed_state& state,
                                     const fp8kit_delayed_scaling_config& config, bool record,
                                     void* stream) {
  ScopedDevice device(input.device_index, kOp);
  const auto s = static_cast<cudaStream_t>(stream);
  Params p = make_params(input, layout, output, stream);
  const dim3 grid = tile_grid(p);
  const float fp8_max = fp8kit_fp8_max(output.dtype);
  if (state.seeded != nullptr) {
    p.seeded = state.seeded;
    launch_amax(p, grid, input.dtype, s);
    p.seeded = nullptr;
  }
  delayed_scales_kernel<<<group_blocks(layout), 128, 0, s>>>(p, state.scale, state.seeded,
                                                              fp8_max, config.margin);
  check_launch(kOp, "launching the grouped delayed scales kernel");
  // The cast's atomicMax folds every group's amax in: a fresh group's
  // again, which leaves it as it is.
  launch_cast(p, grid, input.dtype, output.dtype, s);
  const DelayedUpdate u{state.amax_history, state.scale, state.seeded, config.amax_history_len,
                        config.margin, config.amax_reduction == FP8KIT_AMAX_MOST_RECENT, record,
                        fp8_max};
  delayed_update_kernel<<<unsigned(layout.groups()), kUpdateThreads, 0, s>>>(p, u);
  check_launch(kOp, "launching the grouped delayed-scaling update kernel");
  finish_columnwise(p, layout, input.device_index, s);
}

}  // namespace cuda
}  // namespace fp8kit
