// fp8kit::cuda::quantize_block_scaling and grouped_quantize_block_scaling:
// the launches of block-scaled quantization (fp8kit/block_scaling.h), one
// thread block per 128x128 tile (cast_tile, block_cast_tile.cuh).
//
// A grouped tensor in the padded row layout (fp8kit/grouped.h) is one
// launch over every group's tiles: each group is quantized as a tensor of
// its own, so its last tile stops at its own last row and its scales are
// laid out for its own rows. The groups' table rides in the kernel's
// parameters; a block finds its group there by binary search. A launch per
// group instead left most of the GPU idle where groups are small (64
// experts of 1024 tokens and 2048 features: 128 blocks a launch, a sixth
// of what an H200's SMs hold at once).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "block_cast_tile.cuh"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "error.h"
#include "launch_config.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

using block_cast::BlockCastParams;
using block_cast::kBlocksPerSm;
using block_cast::kThreads;
using block_cast::kTile;

template <int kIn, bool kE4M3, bool k128x128>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kIn>)
    block_cast_kernel(const BlockCastParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  // A 32-bit tile index (a grid holds fewer than 2^31 blocks): a 64-bit
  // one left the 1x128 kernel fewer registers and it spilled.
  block_cast::cast_tile<kIn, kE4M3, k128x128>(p, int32_t(blockIdx.x), smem);
}

// The non-empty groups of a grouped cast, in order: group i's tiles are
// blocks tile_start[i] .. tile_start[i + 1] - 1, its rows first_row[i] ..
// first_row[i + 1] - 1 of the padded layout, its scales row_scales[i] and
// col_scales[i] floats into each copy's scale array. 32-bit entries keep
// the table (16 KiB) inside a kernel's 32 KiB of parameters.
struct GroupTiles {
  int32_t groups;
  int32_t tile_start[kMaxGroups + 1];
  int32_t first_row[kMaxGroups + 1];
  int32_t row_scales[kMaxGroups];
  int32_t col_scales[kMaxGroups];
};

// `groups` as __grid_constant__: indexed in place in parameter memory
// (a by-value array indexed at run time would be copied to each thread's
// local memory).
template <int kIn, bool kE4M3, bool k128x128>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kIn>)
    grouped_block_cast_kernel(const BlockCastParams p, const __grid_constant__ GroupTiles groups) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int32_t tile = int32_t(blockIdx.x);
  int g = 0, last = groups.groups - 1;  // the last group starting at or before `tile`
  while (g < last) {
    const int mid = (g + last + 1) / 2;
    if (groups.tile_start[mid] <= tile) {
      g = mid;
    } else {
      last = mid - 1;
    }
  }
  constexpr int64_t kInBytes = kIn == FP8KIT_FLOAT32 ? 4 : 2;
  constexpr fp8kit_scaling_mode kMode =
      k128x128 ? FP8KIT_SCALING_BLOCK_128X128 : FP8KIT_SCALING_BLOCK_1X128;
  const int64_t first = groups.first_row[g];
  const int64_t at = first * p.cols;
  BlockCastParams q = p;
  q.rows = groups.first_row[g + 1] - first;
  q.in = static_cast<const unsigned char*>(p.in) + at * kInBytes;
  if (p.data != nullptr) {
    q.data = p.data + at;
    q.scales = p.scales + groups.row_scales[g];
    q.layout = BlockScaleLayout::of(kMode, q.rows, p.cols);
  }
  if (p.columnwise != nullptr) {
    q.columnwise = p.columnwise + at;
    q.columnwise_scales = p.columnwise_scales + groups.col_scales[g];
    q.columnwise_layout = BlockScaleLayout::of(kMode, p.cols, q.rows);
  }
  block_cast::cast_tile<kIn, kE4M3, k128x128>(q, tile - groups.tile_start[g], smem);
}

// Sets kKernel's shared memory up (once per device for the carveout) and
// launches `blocks` blocks of it.
template <auto kKernel, int kIn, typename... Args>
void launch(int64_t blocks, cudaStream_t stream, const char* op, const Args&... args) {
  constexpr size_t kSmemBytes = PartStage<kIn, kThreads>::kBytes;
  if constexpr (kSmemBytes > 48 * 1024) {
    // The float32 parts need more than the default 48 KiB of dynamic shared memory.
    cuda_check(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kSmemBytes)),
               op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  }
  // kBlocksPerSm blocks fit only in the largest shared-memory carveout,
  // which the driver, left to choose, need not give (it also weighs the L1
  // cache and kernels running alongside). Asked once per device (a
  // function's attributes are a device's): bit d of carveout_set.
  static std::atomic<uint64_t> carveout_set{0};
  int device = 0;
  cuda_check(cudaGetDevice(&device), op, "cudaGetDevice");
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || (carveout_set.load(std::memory_order_relaxed) & bit) == 0) {
    cuda_check(cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               op, "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
    carveout_set.fetch_or(bit, std::memory_order_relaxed);
  }
  kKernel<<<unsigned(blocks), kThreads, kSmemBytes, stream>>>(args...);
  check_launch(op, "launching the block-scaled cast kernel");
}

// `groups` NULL: one tensor, p's tiles; else the grouped kernel.
template <int kIn, bool kE4M3, bool k128x128>
void launch_typed(const BlockCastParams& p, const GroupTiles* groups, int64_t blocks,
                  cudaStream_t stream, const char* op) {
  if (groups == nullptr) {
    launch<block_cast_kernel<kIn, kE4M3, k128x128>, kIn>(blocks, stream, op, p);
  } else {
    launch<grouped_block_cast_kernel<kIn, kE4M3, k128x128>, kIn>(blocks, stream, op, p, *groups);
  }
}

template <int kIn>
void launch_for_input(const BlockCastParams& p, const GroupTiles* groups, int64_t blocks,
                      fp8kit_dtype fp8, fp8kit_scaling_mode mode, cudaStream_t stream,
                      const char* op) {
  const bool blocks128 = mode == FP8KIT_SCALING_BLOCK_128X128;
  if (fp8 == FP8KIT_E4M3) {
    blocks128 ? launch_typed<kIn, true, true>(p, groups, blocks, stream, op)
              : launch_typed<kIn, true, false>(p, groups, blocks, stream, op);
  } else {
    blocks128 ? launch_typed<kIn, false, true>(p, groups, blocks, stream, op)
              : launch_typed<kIn, false, false>(p, groups, blocks, stream, op);
  }
}

void launch_for(const fp8kit_tensor& input, const fp8kit_tensor& output,
                const BlockCastParams& p, const GroupTiles* groups, int64_t blocks,
                void* stream_ptr, const char* op) {
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (input.dtype) {
    case FP8KIT_FLOAT32:
      launch_for_input<FP8KIT_FLOAT32>(p, groups, blocks, output.dtype, output.scaling_mode,
                                       stream, op);
      break;
    case FP8KIT_BFLOAT16:
      launch_for_input<FP8KIT_BFLOAT16>(p, groups, blocks, output.dtype, output.scaling_mode,
                                        stream, op);
      break;
    default:
      launch_for_input<FP8KIT_FLOAT16>(p, groups, blocks, output.dtype, output.scaling_mode,
                                       stream, op);
      break;
  }
}

// The parameters of a [rows, cols] cast of input into output (the layouts
// those of one tensor of that shape).
BlockCastParams params_of(const fp8kit_tensor& input, const fp8kit_tensor& output, int64_t rows,
                          int64_t cols, const fp8kit_current_scaling_config& config) {
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
  return p;
}

}  // namespace

void quantize_block_scaling(const fp8kit_tensor& input, fp8kit_tensor& output,
                            const fp8kit_current_scaling_config& config, void* stream) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  if (rows == 0 || cols == 0) return;
  const BlockCastParams p = params_of(input, output, rows, cols, config);
  launch_for(input, output, p, nullptr, p.tiles_r * p.tiles_c, stream, "quantize_block_scaling");
}

void grouped_quantize_block_scaling(const fp8kit_tensor& input, const GroupLayout& layout,
                                    const std::vector<int64_t>& row_scales,
                                    const std::vector<int64_t>& col_scales,
                                    fp8kit_tensor& output,
                                    const fp8kit_current_scaling_config& config, void* stream) {
  const char* op = "grouped_quantize_block";
  const int64_t cols = input.shape[1];
  const int64_t tiles_c = ceil_div(cols, kTile);
  // Every group's rows are a multiple of 16 and start at one, so each
  // group's alignment is the whole tensor's, whatever its rows.
  BlockCastParams p = params_of(input, output, input.shape[0], cols, config);
  p.vector_columnwise = is_aligned(output.columnwise_data, 8);
  // Each 32-bit entry of the table is at most its last value: the blocks,
  // the rows, the scale floats.
  const int64_t blocks_bound = ceil_div(layout.column_starts[layout.groups()], kTile) * tiles_c +
                               layout.groups() * tiles_c;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  FP8KIT_CHECK(blocks_bound <= kMax && layout.column_starts[layout.groups()] <= kMax &&
                   row_scales.back() <= kMax && col_scales.back() <= kMax,
               op, ": input [", input.shape[0], ", ", cols, "] has more than 2^31 - 1 rows, "
               "128x128 tiles or block scales; split the groups over several calls");
  GroupTiles groups;
  groups.groups = 0;
  int64_t blocks = 0;
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t rows = layout.padded(g);
    if (rows == 0) continue;
    const int i = groups.groups++;
    groups.tile_start[i] = int32_t(blocks);
    groups.first_row[i] = int32_t(layout.column_starts[g]);
    groups.row_scales[i] = int32_t(row_scales[g]);
    groups.col_scales[i] = int32_t(col_scales[g]);
    blocks += ceil_div(rows, kTile) * tiles_c;
  }
  if (groups.groups == 0) return;
  groups.tile_start[groups.groups] = int32_t(blocks);
  groups.first_row[groups.groups] = int32_t(layout.column_starts[layout.groups()]);
  launch_for(input, output, p, &groups, blocks, stream, op);
}

}  // namespace cuda
}  // namespace fp8kit
