// fp8kit::cuda::norm_backward: dx, dgamma and dbeta of LayerNorm / RMSNorm
// in the order fp8kit/normalization.h documents.
//
// Kernel 1, a block of 256 threads (512 from hidden 4096 on) per tile of 32
// rows (FP8KIT_NORM_BACKWARD_TILE_ROWS):
//   1. per row (each warp takes 32 / warps rows in a row): c1 = sum(xhat * g) / H and
//      c2 = sum(g) / H in the row-sum order (lane l adds chunks l, l+32,
//      ... in order; then the xor butterfly), one read of dy and x;
//   2. the block walks the columns, a thread owning 8 of them: for each
//      row of the tile in order (loads 4 rows ahead) it re-reads dy and x
//      (from L2), writes dx
//      with 16-byte stores and adds dy * xhat and dy to its column
//      partials, which end in the workspace: [tiles][hidden] for dgamma,
//      then [tiles][hidden] for dbeta.
// Kernel 2 (when there is more than one group) adds each group of
// FP8KIT_NORM_BACKWARD_GROUP_TILES tile partials,
// kernel 3 the group partials: two short chains per column instead of one
// long one (a chain of 256 dependent loads took 32 us at 8192 rows).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "dequantize_convert.h"
#include "fused_cast_device.cuh"
#include "launch_config.h"
#include "norm_device.cuh"
#include "norm_math.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kBwdTileRows = FP8KIT_NORM_BACKWARD_TILE_ROWS;
// One block per tile of 32 rows leaves a GPU with few blocks per SM at the
// token counts of a training step (4096 rows: 128 blocks), so the block is
// as wide as the hidden size allows: 512 threads cover 4096 columns in one
// pass. Every thread still walks its columns' rows in order, so the sums
// (and the results) are those of any other width.
constexpr int kBwdMaxThreads = 512;

struct NormBackwardParams {
  const void* dy;
  const void* x;
  const float* mean;  // NULL for RMSNorm
  const float* rsigma;
  const void* gamma;
  void* dx;
  float* dgamma_partials;  // [tiles][hidden]
  float* dbeta_partials;   // [tiles][hidden]
  int64_t rows;
  int64_t hidden;
  bool layernorm;
};

template <int kIn, int kBwdThreads>
__global__ void __launch_bounds__(kBwdThreads) norm_backward_kernel(const NormBackwardParams p) {
  constexpr int kBwdWarps = kBwdThreads / 32;
  static_assert(kBwdTileRows % kBwdWarps == 0, "each warp takes whole rows of the tile");
  __shared__ float tile_mean[kBwdTileRows], tile_rsigma[kBwdTileRows];
  __shared__ float tile_c1[kBwdTileRows], tile_c2[kBwdTileRows];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t r0 = int64_t(blockIdx.x) * kBwdTileRows;
  const float h = float(p.hidden);
  const int64_t chunks = p.hidden / kNormChunk;

  // 1. Row reductions.
  for (int i = 0; i < kBwdTileRows / kBwdWarps; ++i) {
    const int tr = warp * (kBwdTileRows / kBwdWarps) + i;
    const int64_t row = r0 + tr;
    if (row >= p.rows) break;
    const float mean = p.layernorm ? p.mean[row] : 0.0f;
    const float rsigma = p.rsigma[row];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll 4
    for (int64_t k = lane; k < chunks; k += kNormLanes) {
      float dy[8], x[8], g[8];
      load8<kIn>(p.dy, row * p.hidden + k * kNormChunk, dy);
      load8<kIn>(p.x, row * p.hidden + k * kNormChunk, x);
      load8<kIn>(p.gamma, k * kNormChunk, g);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float gj = mul_rn(dy[j], g[j]);
        s1 = add_rn(s1, mul_rn(norm_xhat(x[j], mean, rsigma), gj));
        s2 = add_rn(s2, gj);
      }
    }
    s1 = warp_row_sum(s1);
    s2 = warp_row_sum(s2);
    if (lane == 0) {
      tile_mean[tr] = mean;
      tile_rsigma[tr] = rsigma;
      tile_c1[tr] = div_rn(s1, h);
      tile_c2[tr] = p.layernorm ? div_rn(s2, h) : 0.0f;
    }
  }
  __syncthreads();

  // 2. dx and the column partials, rows in order; kRowBatch rows' loads
  // in flight together (one row at a time left the loop waiting on L2).
  constexpr int kRowBatch = kIn == FP8KIT_FLOAT32 ? 2 : 4;
  const int64_t tile_rows = p.rows - r0 < kBwdTileRows ? p.rows - r0 : kBwdTileRows;
  for (int64_t c0 = int64_t(tid) * 8; c0 < p.hidden; c0 += int64_t(kBwdThreads) * 8) {
    float g[8], dgamma[8] = {}, dbeta[8] = {};
    load8<kIn>(p.gamma, c0, g);
    for (int tr0 = 0; tr0 < tile_rows; tr0 += kRowBatch) {
      Raw8<kIn> raw_dy[kRowBatch], raw_x[kRowBatch];
#pragma unroll
      for (int b = 0; b < kRowBatch; ++b) {
        if (tr0 + b < tile_rows) {
          load_raw8<kIn>(p.dy, (r0 + tr0 + b) * p.hidden + c0, raw_dy[b]);
          load_raw8<kIn>(p.x, (r0 + tr0 + b) * p.hidden + c0, raw_x[b]);
        }
      }
#pragma unroll
      for (int b = 0; b < kRowBatch; ++b) {
        const int tr = tr0 + b;
        if (tr >= tile_rows) break;
        float dx[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float dy = raw_get<kIn>(raw_dy[b], j);
          const float xhat = norm_xhat(raw_get<kIn>(raw_x[b], j), tile_mean[tr], tile_rsigma[tr]);
          dx[j] = norm_dx(p.layernorm, mul_rn(dy, g[j]), xhat, tile_c1[tr], tile_c2[tr],
                          tile_rsigma[tr]);
          dgamma[j] = add_rn(dgamma[j], mul_rn(dy, xhat));
          dbeta[j] = add_rn(dbeta[j], dy);
        }
        store8<kIn>(p.dx, (r0 + tr) * p.hidden + c0, dx);
      }
    }
    float* dg = p.dgamma_partials + int64_t(blockIdx.x) * p.hidden + c0;
    float* db = p.dbeta_partials + int64_t(blockIdx.x) * p.hidden + c0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      dg[j] = dgamma[j];
      db[j] = dbeta[j];
    }
  }
}

struct ParamGradParams {
  float* dgamma_partials;  // tile partials in; group partials written over them
  float* dbeta_partials;
  void* dgamma;
  void* dbeta;  // NULL for RMSNorm
  fp8kit_dtype dgamma_dtype, dbeta_dtype;
  int64_t tiles;
  int64_t hidden;
};

constexpr int kSumThreads = 256;
constexpr int kGroupTiles = FP8KIT_NORM_BACKWARD_GROUP_TILES;

// Kernel 2: a thread per (group of tiles, column) adds the group's tile
// partials in tile order (all its loads in flight at once) and writes the
// sum over the group's first tile partial, which only it reads.
__global__ void __launch_bounds__(kSumThreads) group_sum_kernel(const ParamGradParams p) {
  const int64_t c = int64_t(blockIdx.y) * kSumThreads + threadIdx.x;
  if (c >= p.hidden) return;
  const int64_t t0 = int64_t(blockIdx.x) * kGroupTiles;
  const int64_t n = p.tiles - t0 < kGroupTiles ? p.tiles - t0 : kGroupTiles;
  const bool with_dbeta = p.dbeta != nullptr;
  float dg[kGroupTiles], db[kGroupTiles];
#pragma unroll
  for (int i = 0; i < kGroupTiles; ++i) {
    if (i < n) {
      dg[i] = p.dgamma_partials[(t0 + i) * p.hidden + c];
      db[i] = with_dbeta ? p.dbeta_partials[(t0 + i) * p.hidden + c] : 0.0f;
    }
  }
  float dgamma = 0.0f, dbeta = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroupTiles; ++i) {
    if (i < n) {
      dgamma = add_rn(dgamma, dg[i]);
      dbeta = add_rn(dbeta, db[i]);
    }
  }
  p.dgamma_partials[t0 * p.hidden + c] = dgamma;
  if (with_dbeta) p.dbeta_partials[t0 * p.hidden + c] = dbeta;
}

// Kernel 3: one thread per column adds the group partials in group order
// and rounds to the output dtype. With a single group kernel 2 is not
// launched and this kernel adds the tile partials itself: 0 + (the group's
// sum) is the group's sum, so the result is the same bit for bit.
__global__ void __launch_bounds__(kSumThreads) param_grad_kernel(const ParamGradParams p) {
  const int64_t c = int64_t(blockIdx.x) * kSumThreads + threadIdx.x;
  if (c >= p.hidden) return;
  const int64_t stride = p.tiles <= kGroupTiles ? 1 : kGroupTiles;
  float dgamma = 0.0f, dbeta = 0.0f;
  for (int64_t t = 0; t < p.tiles; t += stride) {
    dgamma = add_rn(dgamma, p.dgamma_partials[t * p.hidden + c]);
    if (p.dbeta != nullptr) dbeta = add_rn(dbeta, p.dbeta_partials[t * p.hidden + c]);
  }
  store_rounded(p.dgamma, p.dgamma_dtype, c, dgamma);
  if (p.dbeta != nullptr) store_rounded(p.dbeta, p.dbeta_dtype, c, dbeta);
}

template <int kThreads>
void launch_norm_backward(fp8kit_dtype dtype, unsigned tiles, const NormBackwardParams& p,
                          cudaStream_t stream) {
  switch (dtype) {
    case FP8KIT_FLOAT32:
      norm_backward_kernel<FP8KIT_FLOAT32, kThreads><<<tiles, kThreads, 0, stream>>>(p);
      break;
    case FP8KIT_BFLOAT16:
      norm_backward_kernel<FP8KIT_BFLOAT16, kThreads><<<tiles, kThreads, 0, stream>>>(p);
      break;
    default:
      norm_backward_kernel<FP8KIT_FLOAT16, kThreads><<<tiles, kThreads, 0, stream>>>(p);
      break;
  }
}

}  // namespace

void norm_backward(const fp8kit_norm_config& config, const fp8kit_tensor& dy,
                   const fp8kit_tensor& x, const fp8kit_tensor* mean, const fp8kit_tensor& rsigma,
                   const fp8kit_tensor& gamma, fp8kit_tensor& dx, fp8kit_tensor& dgamma,
                   fp8kit_tensor* dbeta, float* workspace, void* stream_ptr) {
  const char* op = "norm_backward";
  ScopedDevice device(x.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  NormBackwardParams p{};
  flatten_2d(x, &p.rows, &p.hidden);
  const int64_t tiles = ceil_div(p.rows, kBwdTileRows);
  p.dy = dy.data;
  p.x = x.data;
  p.mean = mean != nullptr ? static_cast<const float*>(mean->data) : nullptr;
  p.rsigma = static_cast<const float*>(rsigma.data);
  p.gamma = gamma.data;
  p.dx = dx.data;
  p.dgamma_partials = workspace;
  p.dbeta_partials = workspace + tiles * p.hidden;
  p.layernorm = config.type == FP8KIT_LAYERNORM;
  if (tiles > 0) {
    if (p.hidden >= 8 * kBwdMaxThreads) {
      launch_norm_backward<kBwdMaxThreads>(x.dtype, unsigned(tiles), p, stream);
    } else {
      launch_norm_backward<kBwdMaxThreads / 2>(x.dtype, unsigned(tiles), p, stream);
    }
    check_launch(op, "launching the normalization backward kernel");
  }
  const ParamGradParams s{p.dgamma_partials, p.dbeta_partials, dgamma.data,
                          dbeta != nullptr ? dbeta->data : nullptr, dgamma.dtype,
                          dbeta != nullptr ? dbeta->dtype : FP8KIT_FLOAT32, tiles, p.hidden};
  const unsigned column_blocks = unsigned(ceil_div(p.hidden, kSumThreads));
  if (tiles > kGroupTiles) {
    const dim3 groups(unsigned(ceil_div(tiles, kGroupTiles)), column_blocks);
    group_sum_kernel<<<groups, kSumThreads, 0, stream>>>(s);
    check_launch(op, "launching the dgamma/dbeta group sums");
  }
  param_grad_kernel<<<column_blocks, kSumThreads, 0, stream>>>(s);
  check_launch(op, "launching the dgamma/dbeta reduction kernel");
}

}  // namespace cuda
}  // namespace fp8kit
