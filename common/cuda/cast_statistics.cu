// fp8kit::cuda::cast_statistics: one pass over the input and the FP8 copy.
//
// The per-element rule is cast_statistics.h's, shared with the CPU
// reference, so amax and the counts are bit-identical and each term of the
// sums is the same double. Each thread accumulates in double, each thread
// block reduces in double; thread 0 of each block commits amax and the
// counts with atomics (order-free: max and integer adds) and writes its two
// double sums to its slot of the caller's workspace, which one
// thread then adds up in block order and rounds once to float32. So the
// sums are the same bits run after run, which float atomics would not give.
//
// The rowwise copy is read in its stored order, which is the input's
// (coalesced for both). The columnwise copy is the transpose: each block
// stages a 32x32 tile of it through shared memory, read along its stored
// rows, and then walks the tile in the input's order, so both reads stay
// coalesced. The stored-order kernel reads 8 elements per thread and step
// (16-byte input loads, 8-byte FP8 loads) where the pointers and, under
// block scaling, the stored row length are multiples of 8 elements, and
// element by element otherwise: a logged step reads every cast tensor once
// more, so this read should run near the memory's bandwidth.
#include <cuda_runtime.h>

#include <cstdint>

#include "block_scale_layout.h"
#include "cast_statistics.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "dequant_scales.cuh"
#include "launch_config.h"
#include "quantize_device.cuh"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kThreads = 1024;  // also one element per thread of a 32x32 tile
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;
constexpr int kVec = 8;  // elements per vector step of the stored-order kernel
constexpr int64_t kMaxBlocks = 128;  // the workspace's slots and the final sum's terms
static_assert(kMaxBlocks * 2 * sizeof(double) <= FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES,
              "the blocks' sums must fit the caller's workspace");

using Partial = CastStatsPartial<double>;

template <int kIn>
__device__ __forceinline__ float load_input(const void* data, int64_t i) {
  const uint32_t bits = load_bits<kIn>(data, i);
  if constexpr (kIn == FP8KIT_FLOAT32) {
    return __uint_as_float(bits);
  } else {
    return bits16_to_float<kIn>(bits);
  }
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Reduces the block's partials and commits them: amax and the counts to
// `out` (zeroed before the launch), the sums to the block's two slots of
// `block_sums`. Called by every thread of the block.
__device__ void block_commit(const Partial& p, const fp8kit_cast_statistics& out,
                             double* block_sums) {
  __shared__ uint32_t warp_max[kWarps];
  __shared__ uint32_t warp_underflow[kWarps], warp_saturated[kWarps];
  __shared__ double warp_error[kWarps], warp_norm[kWarps];
  amax_block_publish(p.amax_bits, warp_max);
  const uint32_t underflow = __reduce_add_sync(0xffffffffu, p.underflow);
  const uint32_t saturated = __reduce_add_sync(0xffffffffu, p.saturated);
  const double error_sq = warp_sum(p.error_sq);
  const double norm_sq = warp_sum(p.norm_sq);
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    warp_underflow[warp] = underflow;
    warp_saturated[warp] = saturated;
    warp_error[warp] = error_sq;
    warp_norm[warp] = norm_sq;
  }
  __syncthreads();
  amax_block_commit<kWarps>(warp_max, out.amax);
  if (threadIdx.x != 0) return;
  uint32_t u = 0, s = 0;
  double e = 0.0, n = 0.0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    u += warp_underflow[w];
    s += warp_saturated[w];
    e += warp_error[w];
    n += warp_norm[w];
  }
  if (u != 0) atomicAdd(out.underflow, u);
  if (s != 0) atomicAdd(out.saturated, s);
  // A NaN or inf partial is kept too: it must reach the output.
  block_sums[2 * blockIdx.x] = e;
  block_sums[2 * blockIdx.x + 1] = n;
}

// One thread: the blocks' sums in block order, each rounded once to float32.
__global__ void sums_kernel(const double* __restrict__ block_sums, int blocks,
                            const fp8kit_cast_statistics out) {
  double e = 0.0, n = 0.0;
  for (int b = 0; b < blocks; ++b) {
    e += block_sums[2 * b];
    n += block_sums[2 * b + 1];
  }
  *out.error_sq = float(e);
  *out.norm_sq = float(n);
}

// A copy whose stored order is the input's: the rowwise copy, or a
// columnwise copy of one row or one column. `stored_cols`: the row length
// of the copy as stored (block scaling and row scales only). row_scales:
// NULL, or the rowwise copy's scale_inv per row, which then replaces the
// copy's own. With `vectors`, the first n / 8 * 8 elements go 8 at a time
// (vector_loads_fit says when).
template <int kIn>
__global__ void __launch_bounds__(kThreads)
    stats_stored_order_kernel(const void* __restrict__ input, const uint8_t* __restrict__ q,
                              int64_t n, int64_t stored_cols, bool vectors,
                              const DequantScales scales, const float* __restrict__ row_scales,
                              fp8kit_dtype fp8_dtype, const fp8kit_cast_statistics out,
                              double* block_sums) {
  // The copy's own scale_inv is not read under row scales (nor a valid
  // device pointer then).
  const float per_tensor = scales.block || row_scales != nullptr ? 0.0f : *scales.scale_inv;
  const auto scale_of = [&](int64_t i) {
    if (row_scales != nullptr) return row_scales[i / stored_cols];
    return scales.block ? scales.at(i / stored_cols, i % stored_cols, 0.0f) : per_tensor;
  };
  Partial p;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t chunks = vectors ? n / kVec : 0;
#pragma unroll 2
  for (int64_t k = first; k < chunks; k += stride) {
    const int64_t i = k * kVec;
    // The 8 elements share one stored row and one block of it.
    const float s = scale_of(i);
    Raw8<kIn> x;
    load_raw8<kIn>(input, i, x);
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(q + i));
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const uint32_t word = j < 4 ? codes.x : codes.y;
      p.add(raw_get<kIn>(x, j), uint8_t(word >> (8 * (j & 3))), fp8_dtype, s);
    }
  }
  for (int64_t i = chunks * kVec + first; i < n; i += stride) {
    p.add(load_input<kIn>(input, i), q[i], fp8_dtype, scale_of(i));
  }
  block_commit(p, out, block_sums);
}

// Whether the stored-order kernel may read 8 elements at a time: the input
// 16-byte aligned (load_raw8), the copy 8-byte aligned, and where the scale
// varies within the tensor (block scaling, row scales) the stored rows a
// multiple of 8 long, so that no 8 elements straddle a row or a 128-wide
// block.
bool vector_loads_fit(const void* input, const uint8_t* q, int64_t stored_cols,
                      bool scale_varies) {
  return reinterpret_cast<uintptr_t>(input) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0 &&
         (!scale_varies || stored_cols % kVec == 0);
}

// The columnwise copy: row-major [cols, rows]; the input row-major [rows,
// cols]. Tiles numbered along cols first, strided over the grid.
template <int kIn>
__global__ void __launch_bounds__(kThreads)
    stats_columnwise_kernel(const void* __restrict__ input, const uint8_t* __restrict__ columnwise,
                            int64_t rows, int64_t cols, int64_t tiles_c, int64_t tiles,
                            const DequantScales scales, fp8kit_dtype fp8_dtype,
                            const fp8kit_cast_statistics out, double* block_sums) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float per_tensor = scales.block ? 0.0f : *scales.scale_inv;
  const int tx = threadIdx.x % kTile;
  const int ty = threadIdx.x / kTile;
  Partial p;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    {
      const int64_t c = c0 + ty, r = r0 + tx;  // coalesced along the stored rows
      if (c < cols && r < rows) tile[ty][tx] = columnwise[c * rows + r];
    }
    __syncthreads();
    const int64_t r = r0 + ty, c = c0 + tx;  // coalesced along the input's rows
    if (r < rows && c < cols) {
      // Logical (r, c) is stored element (c, r).
      p.add(load_input<kIn>(input, r * cols + c), tile[tx][ty], fp8_dtype,
            scales.at(c, r, per_tensor));
    }
    __syncthreads();  // the tile is overwritten next iteration
  }
  block_commit(p, out, block_sums);
}

int64_t grid_size(int64_t work_items, const char* op) {
  int64_t blocks = ceil_div(work_items, kThreads);
  const int64_t resident = int64_t(sm_count(op)) * 2;  // 2 blocks of 1024 threads per SM
  if (blocks > resident) blocks = resident;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return blocks < 1 ? 1 : blocks;
}

template <int kIn>
void launch(const fp8kit_tensor& input, const fp8kit_tensor& quantized, bool from_columnwise,
            const float* row_scale_inv, const fp8kit_cast_statistics& out, cudaStream_t stream,
            const char* op) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  const int64_t n = rows * cols;
  const DequantScales scales = dequant_scales(quantized, from_columnwise, rows, cols);
  // A columnwise copy [cols, 1] or [1, rows] holds its elements in the
  // input's order; its block indices come from its own stored shape.
  const bool stored_order = !from_columnwise || rows == 1 || cols == 1;
  const int64_t tiles_c = ceil_div(cols, kTile);
  const int64_t tiles = ceil_div(rows, kTile) * tiles_c;
  const int64_t blocks = grid_size(stored_order ? n : tiles * kThreads, op);
  // Two doubles per block, in the caller's workspace (kMaxBlocks fit).
  double* sums = static_cast<double*>(out.workspace);
  if (stored_order) {
    const uint8_t* q = static_cast<const uint8_t*>(from_columnwise ? quantized.columnwise_data
                                                                   : quantized.data);
    const int64_t stored_cols = from_columnwise ? rows : cols;
    const bool vectors =
        vector_loads_fit(input.data, q, stored_cols, scales.block || row_scale_inv != nullptr);
    stats_stored_order_kernel<kIn><<<unsigned(blocks), kThreads, 0, stream>>>(
        input.data, q, n, stored_cols, vectors, scales, row_scale_inv, quantized.dtype, out,
        sums);
    check_launch(op, "launching the cast statistics kernel");
  } else {
    stats_columnwise_kernel<kIn><<<unsigned(blocks), kThreads, 0, stream>>>(
        input.data, static_cast<const uint8_t*>(quantized.columnwise_data), rows, cols, tiles_c,
        tiles, scales, quantized.dtype, out, sums);
    check_launch(op, "launching the columnwise cast statistics kernel");
  }
  sums_kernel<<<1, 1, 0, stream>>>(sums, int(blocks), out);
  check_launch(op, "launching the cast statistics sums kernel");
}

}  // namespace

void cast_statistics(const fp8kit_tensor& input, const fp8kit_tensor& quantized,
                     bool from_columnwise, const float* row_scale_inv,
                     const fp8kit_cast_statistics& out, void* stream_ptr) {
  const char* op = "cast_statistics_of";
  ScopedDevice device(input.device_index, op);
  // The kernels accumulate amax and the counts into the outputs and write
  // the sums; an empty tensor leaves all of them 0.
  zero_bytes(input.device_index, out.amax, sizeof(float), stream_ptr);
  zero_bytes(input.device_index, out.underflow, sizeof(unsigned int), stream_ptr);
  zero_bytes(input.device_index, out.saturated, sizeof(unsigned int), stream_ptr);
  zero_bytes(input.device_index, out.error_sq, sizeof(float), stream_ptr);
  zero_bytes(input.device_index, out.norm_sq, sizeof(float), stream_ptr);
  if (fp8kit_tensor_numel(&input) == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (input.dtype) {
    case FP8KIT_FLOAT32:
      launch<FP8KIT_FLOAT32>(input, quantized, from_columnwise, row_scale_inv, out, stream, op);
      break;
    case FP8KIT_BFLOAT16:
      launch<FP8KIT_BFLOAT16>(input, quantized, from_columnwise, row_scale_inv, out, stream, op);
      break;
    default:
      launch<FP8KIT_FLOAT16>(input, quantized, from_columnwise, row_scale_inv, out, stream, op);
      break;
  }
}

}  // namespace cuda
}  // namespace fp8kit
