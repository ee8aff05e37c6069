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
// the state. The amax pass computes the values and their amax only.
//
// SwiGLU backward writes dh [rows, 2F]: a tile of dh's left half computes
// d_gate (reading gate, up and d_a), of its right half d_up (gate, d_a),
// an 8-column group never straddling the halves (F % 16 == 0).
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
  int64_t tiles_c;
  int columnwise_align;  // 16, 8 or 1
  FusedCast cast;
  SumsJob sums;      // kSums only
};

// The 8 values of output row `row`, columns col..col+7.
template <int kIn, ActOp kOp>
__device__ __forceinline__ void act_values(const ActParams& p, int64_t row, int64_t col,
                                           float (&v)[8]) {
  if constexpr (kOp == ActOp::kGeluForward) {
    float h[8];
    load8<kIn>(p.h, row * p.f + col, h);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = gelu_f32(h[j]);
  } else if constexpr (kOp == ActOp::kSwigluForward) {
    float gate[8], up[8];
    load8<kIn>(p.h, row * 2 * p.f + col, gate);
    load8<kIn>(p.h, row * 2 * p.f + p.f + col, up);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = swiglu_f32(gate[j], up[j]);
  } else if constexpr (kOp == ActOp::kGeluBackward) {
    float da[8], h[8];
    load8<kIn>(p.d_a, row * p.f + col, da);
    load8<kIn>(p.h, row * p.f + col, h);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = gelu_backward_f32(da[j], h[j]);
  } else {
    const bool gate_half = col < p.f;
    const int64_t c = gate_half ? col : col - p.f;  // column of a and d_a
    float da[8], gate[8];
    load8<kIn>(p.d_a, row * p.f + c, da);
    load8<kIn>(p.h, row * 2 * p.f + c, gate);
    if (gate_half) {
      float up[8];
      load8<kIn>(p.h, row * 2 * p.f + p.f + c, up);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = swiglu_grad_f32(da[j], gate[j], up[j]).d_gate;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = swiglu_grad_f32(da[j], gate[j], 0.0f).d_up;  // no up
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
__device__ __forceinline__ void store_columnwise_tile(const ActParams& p, int64_t tile_r0,
                                                      int64_t tile_c0,
                                                      const uint4* tile_columnwise) {
#pragma unroll
  for (int it = 0; it < (kCtTile * 8) / kCtThreads; ++it) {
    const int id = it * kCtThreads + int(threadIdx.x);
    const int c = id >> 3;  // tile column = output row
    const int m = id & 7;   // 16-row piece: row groups 2m, 2m+1
    const uint4 v = tile_columnwise[c * 8 + (m ^ ((c >> 3) & 7))];
    const int64_t oc = tile_c0 + c;
    const int64_t orow0 = tile_r0 + 16 * m;
    if (oc < p.cols && orow0 < p.rows) {
      const int64_t left = p.rows - orow0;
      store_columnwise_piece(p.cast.columnwise + oc * p.rows + orow0, v,
                             left >= 16 ? 16 : int(left), p.columnwise_align);
    }
  }
}

template <int kIn, bool kE4M3, ActOp kOp, bool kAmaxPass, bool kSums>
__global__ void __launch_bounds__(kCtThreads) act_kernel(const ActParams p) {
  __shared__ __align__(16) uint4 tile_columnwise[kCtTile * 8];  // as cast_transpose_block's
  __shared__ uint32_t warp_max[kCtWarps];
  if constexpr (kAmaxPass) {
    if (fused_pass_skipped(p.cast)) return;
  }
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int cg = (lane & 7) + 8 * (warp & 1);    // column group 0..15
  const int rg = 4 * (warp >> 1) + (lane >> 3);  // row group 0..15
  const int64_t tile = blockIdx.x;
  const int64_t tile_r0 = (tile / p.tiles_c) * kCtTile;
  const int64_t tile_c0 = (tile % p.tiles_c) * kCtTile;
  const int64_t r0 = tile_r0 + rg * 8;
  const int64_t col = tile_c0 + cg * 8;
  const bool col_ok = col < p.cols;  // cols % 8 == 0: whole groups

  float scale = 1.0f;
  if constexpr (!kAmaxPass) scale = read_scale(p.cast.scale, tile == 0);
  uint32_t amax_bits = 0;
  uint2 q[8];
  float sums[8] = {};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    q[k] = make_uint2(0, 0);
    const int64_t row = r0 + k;
    if (!col_ok || row >= p.rows) {
      if constexpr (kSums) {  // fp8kit_column_sums: rows past the end add 0.0f
#pragma unroll
        for (int j = 0; j < 8; ++j) sums[j] = add_rn(sums[j], 0.0f);
      }
      continue;
    }
    float v[8];
    act_values<kIn, kOp>(p, row, col, v);
    fold_amax8(v, amax_bits);
    if constexpr (!kAmaxPass) {
      if (p.hp_out != nullptr) store8<kIn>(p.hp_out, row * p.cols + col, v);
      q[k] = cast8_values<kE4M3>(v, scale);
      if (p.cast.out != nullptr) *reinterpret_cast<uint2*>(p.cast.out + row * p.cols + col) = q[k];
      if constexpr (kSums) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sums[j] = add_rn(sums[j], v[j]);
      }
    }
  }

  if constexpr (!kAmaxPass) {
    if (p.cast.columnwise != nullptr) stage_columnwise(q, cg, rg, tile_columnwise);
    if constexpr (kSums) {
      __shared__ GroupSums group_sums;
#pragma unroll
      for (int j = 0; j < 8; ++j) group_sums[rg][group_sum_slot(rg, cg * 8 + j)] = sums[j];
      __syncthreads();
      store_columnwise_tile(p, tile_r0, tile_c0, tile_columnwise);  // validated: columnwise set
      CastTransposeParams shape{};  // the two fields finish_column_sums reads
      shape.cols = p.cols;
      shape.tiles_c = p.tiles_c;
      finish_column_sums(p.sums, shape, tile, group_sums);
    } else if (p.cast.columnwise != nullptr) {
      __syncthreads();
      store_columnwise_tile(p, tile_r0, tile_c0, tile_columnwise);
    }
  }
  fused_pass_finish<kCtWarps>(p.cast, amax_bits, warp_max);
}

template <int kIn, bool kE4M3, ActOp kOp, bool kSums>
void launch_passes(ActParams p, const FusedCastPasses& passes, cudaStream_t stream,
                   const char* op) {
  const int64_t tiles = ceil_div(p.rows, kCtTile) * p.tiles_c;
  const unsigned blocks = unsigned(tiles > 0 ? tiles : 1);  // an empty h: one block for the state
  if (passes.amax_pass) {
    p.cast = passes.amax;
    launch_fused_pass(act_kernel<kIn, kE4M3, kOp, true, false>, blocks, kCtThreads, p,
                      passes.pdl, stream, op, "launching the activation amax pass");
  }
  p.cast = passes.cast;
  launch_fused_pass(act_kernel<kIn, kE4M3, kOp, false, kSums>, blocks, kCtThreads, p, passes.pdl,
                    stream, op, "launching the activation kernel");
}

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
  p.tiles_c = ceil_div(cols, kCtTile);
  p.columnwise_align = p.rows % 16 == 0 ? 16 : p.rows % 8 == 0 ? 8 : 1;
  return p;
}

}  // namespace

void activation_forward(fp8kit_activation act, const fp8kit_tensor& h, fp8kit_tensor* a,
                        fp8kit_tensor& a_fp8, const fp8kit_fused_cast& cast, void* stream_ptr) {
  const char* op = "activation_forward";
  ScopedDevice device(h.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t f = a_fp8.shape[a_fp8.rank - 1];
  const ActParams p = act_params(h, a != nullptr ? a->data : nullptr, f, f);
  const FusedCastPasses passes = prepare_fused_cast(a_fp8, cast, stream, op);
  if (act == FP8KIT_SWIGLU) {
    launch_op<ActOp::kSwigluForward, false>(p, h.dtype, a_fp8.dtype, passes, stream, op);
  } else {
    launch_op<ActOp::kGeluForward, false>(p, h.dtype, a_fp8.dtype, passes, stream, op);
  }
}

void activation_backward(fp8kit_activation act, const fp8kit_tensor& d_a, const fp8kit_tensor& h,
                         fp8kit_tensor* dh, fp8kit_tensor& dh_fp8, const fp8kit_fused_cast& cast,
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
  if (act == FP8KIT_SWIGLU) {
    sums != nullptr
        ? launch_op<ActOp::kSwigluBackward, true>(p, h.dtype, dh_fp8.dtype, passes, stream, op)
        : launch_op<ActOp::kSwigluBackward, false>(p, h.dtype, dh_fp8.dtype, passes, stream, op);
  } else {
    sums != nullptr
        ? launch_op<ActOp::kGeluBackward, true>(p, h.dtype, dh_fp8.dtype, passes, stream, op)
        : launch_op<ActOp::kGeluBackward, false>(p, h.dtype, dh_fp8.dtype, passes, stream, op);
  }
}

}  // namespace cuda
}  // namespace fp8kit
