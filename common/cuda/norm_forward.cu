// fp8kit::cuda::norm_forward: LayerNorm / RMSNorm forward with the fused
// FP8 cast (fp8kit/normalization.h, fp8kit/fused_cast.h).
//
// A block of 256 threads owns kNormTileRows = 16 whole rows:
//   1. statistics: warp w takes rows 2w and 2w+1; lane l reads chunks
//      l, l+32, ... of the row with 16-byte loads and adds them in order,
//      then the lanes are combined by the xor butterfly: exactly the row
//      sum of fp8kit/normalization.h (norm_row_sum on the CPU). LayerNorm
//      reads the row twice (mean, then the squared deviations);
//   2. cast: the block walks the hidden dimension in tiles of 16 rows x
//      128 columns, one 8-element vector per thread: re-reads x (the next
//      tile's vector loaded while this one is cast; not from L2 where the
//      rows of all resident blocks exceed it: at 8192 x 4096 bf16 an H100
//      profile reads 132 MB from HBM for 67 MB of x), computes y in float32,
//      writes y (optional), the rowwise FP8 bytes (8-byte stores), and
//      parks them in a 16 x 128 shared tile (8-byte stores, no bank
//      conflict), from which thread c < 128 gathers column c's 16 bytes
//      (4 threads read each word: a broadcast) and writes them as one
//      16-byte columnwise piece;
//   3. amax: warp max, one atomic per block; delayed scaling's last block
//      updates the state (fused_update_device.cuh).
// The amax pass (current scaling, a fresh delayed slot) runs 1 and 2
// without any store; the values pass (no cast) stores mean, rsigma and y
// alone.
#include <cuda_runtime.h>

#include <cstdint>

#include "cast_transpose.cuh"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "fused_cast_device.cuh"
#include "fused_cast_launch.cuh"
#include "launch_config.h"
#include "norm_device.cuh"
#include "norm_math.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kNormTileRows = 16;
constexpr int kNormTileCols = 128;  // 16 threads x 8 columns per row

struct NormForwardParams {
  const void* x;
  const void* gamma;
  const void* beta;   // NULL for RMSNorm
  void* y;            // NULL: not written
  float* mean;        // NULL for RMSNorm
  float* rsigma;
  int64_t rows;
  int64_t hidden;
  float epsilon;
  bool layernorm;
  int columnwise_align;  // 16, 8 or 1: alignment of the columnwise row pieces
  FusedCast cast;
};

// Mean (0 for RMSNorm) and rsigma of one row, by one warp.
template <int kIn>
__device__ __forceinline__ void row_stats(const NormForwardParams& p, int64_t row, float& mean,
                                          float& rsigma) {
  const int lane = threadIdx.x & 31;
  const void* x = p.x;
  const int64_t base = row * p.hidden;
  const int64_t chunks = p.hidden / kNormChunk;
  const float h = float(p.hidden);
  float v[8];
  mean = 0.0f;
  float acc = 0.0f;
  if (p.layernorm) {
#pragma unroll 4
    for (int64_t k = lane; k < chunks; k += kNormLanes) {
      load8<kIn>(x, base + k * kNormChunk, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = add_rn(acc, v[j]);
    }
    mean = div_rn(warp_row_sum(acc), h);
    acc = 0.0f;
#pragma unroll 4
    for (int64_t k = lane; k < chunks; k += kNormLanes) {
      load8<kIn>(x, base + k * kNormChunk, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = sub_rn(v[j], mean);
        acc = add_rn(acc, mul_rn(d, d));
      }
    }
  } else {
#pragma unroll 4
    for (int64_t k = lane; k < chunks; k += kNormLanes) {
      load8<kIn>(x, base + k * kNormChunk, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = add_rn(acc, mul_rn(v[j], v[j]));
    }
  }
  rsigma = norm_rsigma(div_rn(warp_row_sum(acc), h), p.epsilon);
}

template <int kIn, bool kE4M3, FusedPass kPass>
__global__ void __launch_bounds__(kNormThreads) norm_forward_kernel(const NormForwardParams p) {
  constexpr bool kCast = kPass == FusedPass::kCast;
  __shared__ float tile_mean[kNormTileRows], tile_rsigma[kNormTileRows];
  __shared__ __align__(16) uint8_t tile_fp8[kNormTileRows][kNormTileCols];
  __shared__ uint32_t warp_max[kNormWarps];
  if constexpr (kPass == FusedPass::kAmax) {
    if (fused_pass_skipped(p.cast)) return;
  }
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int64_t r0 = int64_t(blockIdx.x) * kNormTileRows;

  // 1. Statistics.
  for (int i = 0; i < kNormTileRows / kNormWarps; ++i) {
    const int tr = warp * (kNormTileRows / kNormWarps) + i;
    if (r0 + tr >= p.rows) break;
    float mean, rsigma;
    row_stats<kIn>(p, r0 + tr, mean, rsigma);
    if ((tid & 31) == 0) {
      tile_mean[tr] = mean;
      tile_rsigma[tr] = rsigma;
      if (kPass != FusedPass::kAmax) {
        if (p.mean != nullptr) store_rounded(p.mean, FP8KIT_FLOAT32, r0 + tr, mean);
        store_rounded(p.rsigma, FP8KIT_FLOAT32, r0 + tr, rsigma);
      }
    }
  }
  __syncthreads();

  // 2. Cast, 16 x 128 tiles along the rows.
  float scale = 1.0f;
  if constexpr (kCast) scale = read_scale(p.cast.scale, blockIdx.x == 0);
  const int tr = tid / (kNormTileCols / 8);  // row of the tile
  const int cg = tid % (kNormTileCols / 8);  // 8-column group
  const int64_t row = r0 + tr;
  const bool row_ok = row < p.rows;
  const float mean = row_ok ? tile_mean[tr] : 0.0f;
  const float rsigma = row_ok ? tile_rsigma[tr] : 0.0f;
  const int64_t tile_rows_left = p.rows - r0;
  uint32_t amax_bits = 0;
  // x of the next column tile is loaded while this one is cast (one load
  // per tile kept each thread waiting on L2 between the barriers).
  Raw8<kIn> next_x;
  if (row_ok && cg * 8 < p.hidden) load_raw8<kIn>(p.x, row * p.hidden + cg * 8, next_x);
  for (int64_t c0 = 0; c0 < p.hidden; c0 += kNormTileCols) {
    const int64_t col = c0 + cg * 8;
    const bool ok = row_ok && col < p.hidden;  // hidden % 8 == 0: whole groups
    const Raw8<kIn> raw_x = next_x;
    if (row_ok && col + kNormTileCols < p.hidden) {
      load_raw8<kIn>(p.x, row * p.hidden + col + kNormTileCols, next_x);
    }
    if (ok) {
      float x[8], g[8], b[8], y[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = raw_get<kIn>(raw_x, j);
      load8<kIn>(p.gamma, col, g);
      if (p.layernorm) load8<kIn>(p.beta, col, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y[j] = norm_y(p.layernorm, norm_xhat(x[j], mean, rsigma), g[j], p.layernorm ? b[j] : 0.0f);
      }
      if constexpr (kPass != FusedPass::kValues) fold_amax8(y, amax_bits);
      if constexpr (kPass != FusedPass::kAmax) {
        if (p.y != nullptr) store8<kIn>(p.y, row * p.hidden + col, y);
      }
      if constexpr (kCast) {
        const uint2 q = cast8_values<kE4M3>(y, scale);
        if (p.cast.out != nullptr) {
          *reinterpret_cast<uint2*>(p.cast.out + row * p.hidden + col) = q;
        }
        *reinterpret_cast<uint2*>(&tile_fp8[tr][cg * 8]) = q;
      }
    }
    if constexpr (kCast) {
      if (p.cast.columnwise != nullptr) {
        __syncthreads();
        if (tid < kNormTileCols && c0 + tid < p.hidden) {
          uint32_t w[4] = {};
#pragma unroll
          for (int r = 0; r < kNormTileRows; ++r) {
            w[r / 4] |= uint32_t(tile_fp8[r][tid]) << (8 * (r % 4));
          }
          const uint4 piece = make_uint4(w[0], w[1], w[2], w[3]);
          store_columnwise_piece(p.cast.columnwise + (c0 + tid) * p.rows + r0, piece,
                                 tile_rows_left >= 16 ? 16 : int(tile_rows_left),
                                 p.columnwise_align);
        }
        __syncthreads();
      }
    }
  }

  // 3. Amax, and the delayed-scaling update.
  if constexpr (kPass != FusedPass::kValues) {
    fused_pass_finish<kNormWarps>(p.cast, amax_bits, warp_max);
  }
}

unsigned norm_blocks(const NormForwardParams& p) {
  const int64_t tiles = ceil_div(p.rows, kNormTileRows);
  return unsigned(tiles > 0 ? tiles : 1);  // an empty x: one block for the state
}

template <int kIn, bool kE4M3>
void launch_typed(NormForwardParams p, const FusedCastPasses& passes, cudaStream_t stream,
                  const char* op) {
  const unsigned blocks = norm_blocks(p);
  if (passes.amax_pass) {
    p.cast = passes.amax;
    launch_pdl_or_plain(norm_forward_kernel<kIn, kE4M3, FusedPass::kAmax>, blocks, kNormThreads, p,
                        passes.pdl, stream, op, "launching the normalization amax pass");
  }
  p.cast = passes.cast;
  launch_pdl_or_plain(norm_forward_kernel<kIn, kE4M3, FusedPass::kCast>, blocks, kNormThreads, p,
                      passes.pdl, stream, op, "launching the normalization kernel");
}

template <int kIn>
void launch_in(const NormForwardParams& p, fp8kit_dtype fp8, const FusedCastPasses& passes,
               cudaStream_t stream, const char* op) {
  if (passes.values_only) {  // no FP8 format: the kernel's kE4M3 is unused
    launch_pdl_or_plain(norm_forward_kernel<kIn, true, FusedPass::kValues>, norm_blocks(p),
                        kNormThreads, p, false, stream, op, "launching the normalization kernel");
  } else if (fp8 == FP8KIT_E4M3) {
    launch_typed<kIn, true>(p, passes, stream, op);
  } else {
    launch_typed<kIn, false>(p, passes, stream, op);
  }
}

}  // namespace

void norm_forward(const fp8kit_norm_config& config, const fp8kit_tensor& x,
                  const fp8kit_tensor& gamma, const fp8kit_tensor* beta, fp8kit_tensor* y,
                  fp8kit_tensor* y_fp8, const fp8kit_fused_cast* cast, fp8kit_tensor* mean,
                  fp8kit_tensor& rsigma, void* stream_ptr) {
  const char* op = "norm_forward";
  ScopedDevice device(x.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  NormForwardParams p{};
  flatten_2d(x, &p.rows, &p.hidden);
  p.x = x.data;
  p.gamma = gamma.data;
  p.beta = beta != nullptr ? beta->data : nullptr;
  p.y = y != nullptr ? y->data : nullptr;
  p.mean = mean != nullptr ? static_cast<float*>(mean->data) : nullptr;
  p.rsigma = static_cast<float*>(rsigma.data);
  p.epsilon = config.epsilon;
  p.layernorm = config.type == FP8KIT_LAYERNORM;
  p.columnwise_align = p.rows % 16 == 0 ? 16 : p.rows % 8 == 0 ? 8 : 1;
  const FusedCastPasses passes = prepare_fused_cast(y_fp8, cast, stream, op);
  const fp8kit_dtype fp8 = y_fp8 != nullptr ? y_fp8->dtype : FP8KIT_E4M3;
  switch (x.dtype) {
    case FP8KIT_FLOAT32: launch_in<FP8KIT_FLOAT32>(p, fp8, passes, stream, op); break;
    case FP8KIT_BFLOAT16: launch_in<FP8KIT_BFLOAT16>(p, fp8, passes, stream, op); break;
    default: launch_in<FP8KIT_FLOAT16>(p, fp8, passes, stream, op); break;
  }
}

}  // namespace cuda
}  // namespace fp8kit
