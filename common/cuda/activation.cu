// fp8kit::cuda::activation_forward / activation_backward: GELU and SwiGLU
// (and their gradients) with the fused FP8 cast (fp8kit/activation.h,
// fp8kit/fused_cast.h).
//
// The tiling of the cast+transpose kernel (cast_transpose.cuh): a block of
// 256 threads owns a 128x128 tile of the output, a thread an 8x8
// micro-tile (8 rows of 8 consecutive columns). Per row the thread loads
// its inputs with 16-byte vectors, computes the 8 float32 values
// (activation_math.h), writes the optional high-precision copy and the
// rowwise FP8 bytes, and folds the values into the amax and (backward)
// the column-sum group sums; the columnwise bytes go through the swizzled
// shared-memory tile of cast_transpose.cuh to 16-byte stores; column sums
// finish as in column_sums.cuh; the last block of a delayed cast updates
// the state. The amax pass computes the values and their amax only; the
// values pass (no cast) writes the high-precision values alone.
//
// SwiGLU backward writes dh [rows, 2F] = [d_gate | d_up], and both halves
// of a column need sigmoid(gate): a tile there holds 64 columns of each
// half (the gate ones first), and a block of 128 threads computes them, a
// thread the 8x8 micro-tile of d_gate and the one of d_up beside it from
// one sigmoid per element (swiglu_grad_f32). Its column tiles are as many
// as dh's 128-column ones (ceil(F / 64) = ceil(2F / 128)), so the column
// sums' counters fit.
#include <cuda_runtime.h>

#include <cstdint>

#include "activation_math.h"
#include "cast_transpose.cuh"
#include "column_sums.cuh"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "fused_cast_device.cuh"
#include "fused_cast_launch.cuh"
#include "launch_config.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

enum class ActOp { kGeluForward, kSwigluForward, kGeluBackward, kSwigluBackward };

struct ActParams {
  const void* h;     // [rows, F] or [rows, 2F]
  const void* d_a;   // backward: [rows, F]
  void* hp_out;      // optional high-precision output, [rows, cols]
  int64_t rows;
  int64_t cols;      // of the output: F, or 2F for SwiGLU backward
  int64_t f;         // F
  int64_t tiles_c;   // column tiles (launch_passes)
  int columnwise_align;  // 16, 8 or 1
  FusedCast cast;
  SumsJob sums;      // kSums only
};

// How a block of kOp covers its 128x128 output tile: kMicroTiles 8x8
// micro-tiles per thread (2 for SwiGLU backward: d_gate and d_up, micro-tile
// mt at tile columns 8 (cg + 8 mt)), so 256 / kMicroTiles threads in 16 row
// groups x kColGroups column groups.
template <ActOp kOp>
struct TileShape {
  static constexpr int kMicroTiles = kOp == ActOp::kSwigluBackward ? 2 : 1;
  static constexpr int kThreads = kCtThreads / kMicroTiles;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kColGroups = 16 / kMicroTiles;
  static constexpr int kCols = 8 * kColGroups;  // input columns of a tile (per micro-tile)
};

// The output column of tile column tc (0..127) of column tile tile_c; p.cols
// where there is none (past the end).
template <ActOp kOp>
__device__ __forceinline__ int64_t output_col(const ActParams& p, int64_t tile_c, int tc) {
  if constexpr (kOp == ActOp::kSwigluBackward) {
    constexpr int kCols = TileShape<kOp>::kCols;
    const int64_t c = tile_c * kCols + tc % kCols;  // column of gate, up and d_a
    if (c >= p.f) return p.cols;
    return tc < kCols ? c : p.f + c;
  } else {
    const int64_t c = tile_c * kCtTile + tc;
    return c < p.cols ? c : p.cols;
  }
}

// The raw inputs of one row for 8 input columns: GELU h; SwiGLU gate, up;
// GELU backward d_a, h; SwiGLU backward d_a, gate, up.
template <int kIn, ActOp kOp>
struct ActRaw {
  static constexpr int kLoads = kOp == ActOp::kGeluForward    ? 1
                                : kOp == ActOp::kSwigluBackward ? 3
                                                                : 2;
  Raw8<kIn> r[kLoads];
};

// Rows a thread loads before computing any of them: their 16-byte loads are
// in flight together. With 16-bit inputs all 8 rows of the micro-tile: a
// thread then waits on memory once (batches of 4 left the kernels at
// 64-78% of the bytes-moved limit once the sigmoid no longer bound them).
// Two for float32 inputs, whose rows take twice the registers.
template <int kIn>
constexpr int kActLoadBatch = kIn == FP8KIT_FLOAT32 ? 2 : 8;

template <int kIn, ActOp kOp>
__device__ __forceinline__ void load_act_row(const ActParams& p, int64_t row, int64_t col,
                                             ActRaw<kIn, kOp>& a) {
  if constexpr (kOp == ActOp::kGeluForward) {
    load_raw8<kIn>(p.h, row * p.f + col, a.r[0]);
  } else if constexpr (kOp == ActOp::kSwigluForward) {
    load_raw8<kIn>(p.h, row * 2 * p.f + col, a.r[0]);
    load_raw8<kIn>(p.h, row * 2 * p.f + p.f + col, a.r[1]);
  } else if constexpr (kOp == ActOp::kGeluBackward) {
    load_raw8<kIn>(p.d_a, row * p.f + col, a.r[0]);
    load_raw8<kIn>(p.h, row * p.f + col, a.r[1]);
  } else {
    load_raw8<kIn>(p.d_a, row * p.f + col, a.r[0]);
    load_raw8<kIn>(p.h, row * 2 * p.f + col, a.r[1]);
    load_raw8<kIn>(p.h, row * 2 * p.f + p.f + col, a.r[2]);
  }
}

// The values of a row's 8 input columns: v[0] the activation's 8 outputs;
// for SwiGLU backward v[0] = d_gate and v[1] = d_up of those columns.
template <int kIn, ActOp kOp>
__device__ __forceinline__ void act_values(const ActRaw<kIn, kOp>& a,
                                           float (&v)[TileShape<kOp>::kMicroTiles][8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if constexpr (kOp == ActOp::kGeluForward) {
      v[0][j] = gelu_f32(raw_get<kIn>(a.r[0], j));
    } else if constexpr (kOp == ActOp::kSwigluForward) {
      v[0][j] = swiglu_f32(raw_get<kIn>(a.r[0], j), raw_get<kIn>(a.r[1], j));
    } else if constexpr (kOp == ActOp::kGeluBackward) {
      v[0][j] = gelu_backward_f32(raw_get<kIn>(a.r[0], j), raw_get<kIn>(a.r[1], j));
    } else {
      const SwigluGrad g = swiglu_grad_f32(raw_get<kIn>(a.r[0], j), raw_get<kIn>(a.r[1], j),
                                           raw_get<kIn>(a.r[2], j));
      v[0][j] = g.d_gate;
      v[1][j] = g.d_up;
    }
  }
}

// This thread's 8x8 FP8 bytes, transposed into the swizzled shared tile
// of cast_transpose_block (slot_of).
__device__ __forceinline__ void stage_columnwise(const uint2 (&q)[8], int cg, int rg,
                                                 uint4* tile_columnwise) {
  uint2 q_columnwise[8];
  transpose8x8(q, q_columnwise);
  uint2* tile8 = reinterpret_cast<uint2*>(tile_columnwise);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int c = cg * 8 + j;
    tile8[c * 16 + slot_of(c, rg)] = q_columnwise[j];
  }
}

// The staged tile written as 16-byte pieces of the columnwise rows (after
// a __syncthreads).
template <ActOp kOp>
__device__ __forceinline__ void store_columnwise_tile(const ActParams& p, int64_t tile_r0,
                                                      int64_t tile_c,
                                                      const uint4* tile_columnwise) {
  constexpr int kThreads = TileShape<kOp>::kThreads;
#pragma unroll
  for (int it = 0; it < (kCtTile * 8) / kThreads; ++it) {
    const int id = it * kThreads + int(threadIdx.x);
    const int c = id >> 3;  // tile column = output row
    const int m = id & 7;   // 16-row piece: row groups 2m, 2m+1
    const uint4 v = tile_columnwise[c * 8 + (m ^ ((c >> 3) & 7))];
    const int64_t oc = output_col<kOp>(p, tile_c, c);
    const int64_t orow0 = tile_r0 + 16 * m;
    if (oc < p.cols && orow0 < p.rows) {
      const int64_t left = p.rows - orow0;
      store_columnwise_piece(p.cast.columnwise + oc * p.rows + orow0, v,
                             left >= 16 ? 16 : int(left), p.columnwise_align);
    }
  }
}

// SwiGLU backward's 128-thread blocks are held to 128 registers a thread,
// so that four blocks share an SM (153 left three with the column sums).
// The other kernels get no bound (0): ptxas's own choice keeps GELU at three
// and two blocks an SM; a bound of one block let it take more registers and
// run 15-30% slower.
template <ActOp kOp>
constexpr int kActMinBlocks = kOp == ActOp::kSwigluBackward ? 4 : 0;

template <int kIn, bool kE4M3, ActOp kOp, FusedPass kPass, bool kSums>
__global__ void __launch_bounds__(TileShape<kOp>::kThreads, kActMinBlocks<kOp>)
    act_kernel(const ActParams p) {
  static_assert(!kSums || kPass == FusedPass::kCast, "column sums come with the cast");
  constexpr bool kCast = kPass == FusedPass::kCast;
  using Shape = TileShape<kOp>;
  constexpr int kMicroTiles = Shape::kMicroTiles;
  __shared__ __align__(16) uint4 tile_columnwise[kCtTile * 8];  // as cast_transpose_block's
  __shared__ uint32_t warp_max[Shape::kWarps];
  if constexpr (kPass == FusedPass::kAmax) {
    if (fused_pass_skipped(p.cast)) return;
  }
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  // A warp: 8 column groups x 4 row groups, as cast_transpose_block's (the
  // shared-memory swizzles assume it).
  constexpr int kWarpCols = Shape::kColGroups / 8;
  const int cg = (lane & 7) + 8 * (warp % kWarpCols);  // column group of micro-tile 0
  const int rg = 4 * (warp / kWarpCols) + (lane >> 3);  // row group 0..15
  const int64_t tile = blockIdx.x;
  const int64_t tile_r = tile / p.tiles_c;
  const int64_t tile_c = tile % p.tiles_c;
  const int64_t tile_r0 = tile_r * kCtTile;
  const int64_t r0 = tile_r0 + rg * 8;
  const int64_t col = tile_c * Shape::kCols + cg * 8;  // input column
  const bool col_ok = output_col<kOp>(p, tile_c, cg * 8) < p.cols;  // cols % 8 == 0: whole groups

  float scale = 1.0f;
  if constexpr (kCast) scale = read_scale(p.cast.scale, tile == 0);
  uint32_t amax_bits = 0;
  uint2 q[kMicroTiles][8];
  float sums[kMicroTiles][8] = {};
  constexpr int kBatch = kActLoadBatch<kIn>;
  ActRaw<kIn, kOp> raw[kBatch];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k % kBatch == 0) {  // the next kBatch rows' loads, all in flight before any is used
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (col_ok && r0 + k + b < p.rows) load_act_row<kIn, kOp>(p, r0 + k + b, col, raw[b]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMicroTiles; ++mt) q[mt][k] = make_uint2(0, 0);
    const int64_t row = r0 + k;
    if (!col_ok || row >= p.rows) {
      if constexpr (kSums) {  // fp8kit_column_sums: rows past the end add 0.0f
#pragma unroll
        for (int mt = 0; mt < kMicroTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sums[mt][j] = add_rn(sums[mt][j], 0.0f);
        }
      }
      continue;
    }
    float v[kMicroTiles][8];
    act_values<kIn, kOp>(raw[k % kBatch], v);
#pragma unroll
    for (int mt = 0; mt < kMicroTiles; ++mt) {
      if constexpr (kPass != FusedPass::kValues) fold_amax8(v[mt], amax_bits);
      if constexpr (kPass != FusedPass::kAmax) {
        const int64_t out = row * p.cols + output_col<kOp>(p, tile_c, (cg + 8 * mt) * 8);
        if (p.hp_out != nullptr) store8<kIn>(p.hp_out, out, v[mt]);
        if constexpr (kCast) {
          q[mt][k] = cast8_values<kE4M3>(v[mt], scale);
          if (p.cast.out != nullptr) *reinterpret_cast<uint2*>(p.cast.out + out) = q[mt][k];
          if constexpr (kSums) {
#pragma unroll
            for (int j = 0; j < 8; ++j) sums[mt][j] = add_rn(sums[mt][j], v[mt][j]);
          }
        }
      }
    }
  }

  if constexpr (kCast) {
    if (p.cast.columnwise != nullptr) {
#pragma unroll
      for (int mt = 0; mt < kMicroTiles; ++mt) {
        stage_columnwise(q[mt], cg + 8 * mt, rg, tile_columnwise);
      }
    }
    if constexpr (kSums) {
      __shared__ GroupSums group_sums;
#pragma unroll
      for (int mt = 0; mt < kMicroTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          group_sums[rg][group_sum_slot(rg, (cg + 8 * mt) * 8 + j)] = sums[mt][j];
        }
      }
      __syncthreads();
      // The partials are published before the columnwise stores, so that
      // the fence does not wait for those.
      const int64_t sums_col = output_col<kOp>(p, tile_c, int(threadIdx.x));
      const unsigned counted =
          publish_column_sums(p.sums, p.cols, tile_r, tile_c, sums_col, group_sums);
      store_columnwise_tile<kOp>(p, tile_r0, tile_c, tile_columnwise);  // validated: columnwise set
      finish_column_sums_if_last(p.sums, p.cols, tile_c, sums_col, counted);
    } else if (p.cast.columnwise != nullptr) {
      __syncthreads();
      store_columnwise_tile<kOp>(p, tile_r0, tile_c, tile_columnwise);
    }
  }
  if constexpr (kPass != FusedPass::kValues) {
    fused_pass_finish<Shape::kWarps>(p.cast, amax_bits, warp_max);
  }
}

template <int kIn, bool kE4M3, ActOp kOp, bool kSums>
void launch_passes(ActParams p, const FusedCastPasses& passes, cudaStream_t stream,
                   const char* op) {
  constexpr int kThreads = TileShape<kOp>::kThreads;
  p.tiles_c = ceil_div(kOp == ActOp::kSwigluBackward ? p.f : p.cols, TileShape<kOp>::kCols);
  const int64_t tiles = ceil_div(p.rows, kCtTile) * p.tiles_c;
  const unsigned blocks = unsigned(tiles > 0 ? tiles : 1);  // an empty h: one block for the state
  if (passes.values_only) {  // launch_op passes kE4M3 true (unused), kSums false
    if constexpr (kE4M3 && !kSums) {
      launch_pdl_or_plain(act_kernel<kIn, kE4M3, kOp, FusedPass::kValues, false>, blocks, kThreads,
                          p, false, stream, op, "launching the activation kernel");
    }
    return;
  }
  if (passes.amax_pass) {
    p.cast = passes.amax;
    launch_pdl_or_plain(act_kernel<kIn, kE4M3, kOp, FusedPass::kAmax, false>, blocks, kThreads, p,
                        passes.pdl, stream, op, "launching the activation amax pass");
  }
  p.cast = passes.cast;
  launch_pdl_or_plain(act_kernel<kIn, kE4M3, kOp, FusedPass::kCast, kSums>, blocks, kThreads, p,
                      passes.pdl, stream, op, "launching the activation kernel");
}

// fp8: the FP8 output's format, E4M3 when the op casts nothing.
template <ActOp kOp, bool kSums>
void launch_op(const ActParams& p, fp8kit_dtype in, fp8kit_dtype fp8,
               const FusedCastPasses& passes, cudaStream_t stream, const char* op) {
  const bool e4m3 = fp8 == FP8KIT_E4M3;
  switch (in) {
    case FP8KIT_FLOAT32:
      e4m3 ? launch_passes<FP8KIT_FLOAT32, true, kOp, kSums>(p, passes, stream, op)
           : launch_passes<FP8KIT_FLOAT32, false, kOp, kSums>(p, passes, stream, op);
      break;
    case FP8KIT_BFLOAT16:
      e4m3 ? launch_passes<FP8KIT_BFLOAT16, true, kOp, kSums>(p, passes, stream, op)
           : launch_passes<FP8KIT_BFLOAT16, false, kOp, kSums>(p, passes, stream, op);
      break;
    default:
      e4m3 ? launch_passes<FP8KIT_FLOAT16, true, kOp, kSums>(p, passes, stream, op)
           : launch_passes<FP8KIT_FLOAT16, false, kOp, kSums>(p, passes, stream, op);
      break;
  }
}

ActParams act_params(const fp8kit_tensor& h, void* hp_out, int64_t cols, int64_t f) {
  ActParams p{};
  int64_t h_cols = 0;
  flatten_2d(h, &p.rows, &h_cols);
  p.h = h.data;
  p.hp_out = hp_out;
  p.cols = cols;
  p.f = f;
  p.columnwise_align = p.rows % 16 == 0 ? 16 : p.rows % 8 == 0 ? 8 : 1;
  return p;
}

}  // namespace

void activation_forward(fp8kit_activation act, const fp8kit_tensor& h, fp8kit_tensor* a,
                        fp8kit_tensor* a_fp8, const fp8kit_fused_cast* cast, void* stream_ptr) {
  const char* op = "activation_forward";
  ScopedDevice device(h.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t h_cols = h.shape[h.rank - 1];
  const int64_t f = act == FP8KIT_SWIGLU ? h_cols / 2 : h_cols;
  const ActParams p = act_params(h, a != nullptr ? a->data : nullptr, f, f);
  const FusedCastPasses passes = prepare_fused_cast(a_fp8, cast, stream, op);
  const fp8kit_dtype fp8 = a_fp8 != nullptr ? a_fp8->dtype : FP8KIT_E4M3;
  if (act == FP8KIT_SWIGLU) {
    launch_op<ActOp::kSwigluForward, false>(p, h.dtype, fp8, passes, stream, op);
  } else {
    launch_op<ActOp::kGeluForward, false>(p, h.dtype, fp8, passes, stream, op);
  }
}

void activation_backward(fp8kit_activation act, const fp8kit_tensor& d_a, const fp8kit_tensor& h,
                         fp8kit_tensor* dh, fp8kit_tensor* dh_fp8, const fp8kit_fused_cast* cast,
                         const fp8kit_column_sums* sums, void* stream_ptr) {
  const char* op = "activation_backward";
  ScopedDevice device(h.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t h_cols = h.shape[h.rank - 1];
  const int64_t f = act == FP8KIT_SWIGLU ? h_cols / 2 : h_cols;
  ActParams p = act_params(h, dh != nullptr ? dh->data : nullptr, h_cols, f);
  p.d_a = d_a.data;
  if (sums != nullptr) p.sums = sums_job(*sums, p.rows);
  const FusedCastPasses passes = prepare_fused_cast(dh_fp8, cast, stream, op);
  const fp8kit_dtype fp8 = dh_fp8 != nullptr ? dh_fp8->dtype : FP8KIT_E4M3;
  if (act == FP8KIT_SWIGLU) {
    sums != nullptr
        ? launch_op<ActOp::kSwigluBackward, true>(p, h.dtype, fp8, passes, stream, op)
        : launch_op<ActOp::kSwigluBackward, false>(p, h.dtype, fp8, passes, stream, op);
  } else {
    sums != nullptr
        ? launch_op<ActOp::kGeluBackward, true>(p, h.dtype, fp8, passes, stream, op)
        : launch_op<ActOp::kGeluBackward, false>(p, h.dtype, fp8, passes, stream, op);
  }
}

}  // namespace cuda
}  // namespace fp8kit
