// The fused cast (fp8kit/fused_cast.h) inside a kernel that computes
// float32 values itself: what a pass needs to know (FusedCast), 8-element
// float loads and high-precision stores, the scale-and-cast of 8 values,
// and the end of a pass (amax atomic, delayed-scaling update).
//
// A fused op runs its kernel in up to two passes (FusedCastPasses,
// fused_cast_launch.cuh): an amax pass that computes the values and only
// accumulates their amax, then the cast pass that writes everything; or,
// when the op casts nothing, one values pass.
#ifndef FP8KIT_CUDA_FUSED_CAST_DEVICE_CUH_
#define FP8KIT_CUDA_FUSED_CAST_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "dequantize_convert.h"
#include "fused_update_device.cuh"
#include "quantize_device.cuh"

namespace fp8kit {
namespace cuda {

// What one launch of a fused op's kernel does.
enum class FusedPass {
  kAmax,    // computes the values and accumulates their amax, stores nothing
  kCast,    // writes the outputs: FP8 copies, high-precision values, amax, state
  kValues,  // writes the high-precision values alone (the op casts nothing)
};

// One pass's view of the fused cast.
struct FusedCast {
  ScaleSource scale;     // cast pass: the scale (read_scale)
  uint8_t* out;          // cast pass: rowwise FP8 or NULL
  uint8_t* columnwise;   // cast pass: columnwise FP8 or NULL
  float* amax;           // atomicMax target of |value| (NULL: none)
  const float* skip_if;  // amax pass of a delayed slot: exit when *skip_if != 0 (seeded)
  bool update;           // cast pass of delayed scaling: the last block runs finish_job
  FusedState state;
  UpdateConfig config;
};

// The whole block exits when this pass has nothing to do (a seeded slot's
// amax pass). Uniform across the block.
__device__ __forceinline__ bool fused_pass_skipped(const FusedCast& c) {
  return c.skip_if != nullptr && *c.skip_if != 0.0f;
}

// 8 consecutive elements from element `idx` (16-byte aligned) as floats.
template <int kIn>
__device__ __forceinline__ void load8(const void* base, int64_t idx, float (&v)[8]) {
  Raw8<kIn> r;
  load_raw8<kIn>(base, idx, r);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = raw_get<kIn>(r, j);
}

// 8 values stored from element `idx` (16-byte aligned) in kIn, rounded as
// store_rounded does (RNE, canonical NaN).
template <int kIn>
__device__ __forceinline__ void store8(void* base, int64_t idx, const float (&v)[8]) {
  if constexpr (kIn == FP8KIT_FLOAT32) {
    uint32_t w[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = __float_as_uint(v[j]);
      w[j] = (b & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : b;
    }
    uint4* p = reinterpret_cast<uint4*>(static_cast<float*>(base) + idx);
    p[0] = make_uint4(w[0], w[1], w[2], w[3]);
    p[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = kIn == FP8KIT_BFLOAT16 ? float_to_bf16_bits(v[2 * j])
                                                 : float_to_fp16_bits(v[2 * j]);
      const uint32_t hi = kIn == FP8KIT_BFLOAT16 ? float_to_bf16_bits(v[2 * j + 1])
                                                 : float_to_fp16_bits(v[2 * j + 1]);
      w[j] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + idx) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Folds |v| into amax_bits (largest |v| bit pattern, NaN above +inf).
__device__ __forceinline__ void fold_amax8(const float (&v)[8], uint32_t& amax_bits) {
#pragma unroll
  for (int j = 0; j < 8; ++j) amax_bits = max(amax_bits, __float_as_uint(v[j]) & 0x7fffffffu);
}

// 8 values scaled and cast to FP8 (.x = values 0..3), as fp8kit_quantize:
// one correctly rounded multiply, then the conversion.
template <bool kE4M3>
__device__ __forceinline__ uint2 cast8_values(const float (&v)[8], float scale) {
  return quantize8<kE4M3>(v, scale);
}

// The end of a pass, by every thread of the block: the block's amax (one
// atomic) and, in a delayed cast pass, the last-block update. `warp_max`
// is __shared__ with one slot per warp.
template <int kWarps>
__device__ __forceinline__ void fused_pass_finish(const FusedCast& c, uint32_t amax_bits,
                                                  uint32_t* warp_max) {
  amax_block_publish(amax_bits, warp_max);
  __syncthreads();
  if (c.amax != nullptr) amax_block_commit<kWarps>(warp_max, c.amax);
  if (c.update) finish_job(c.state, c.config, gridDim.x);
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_FUSED_CAST_DEVICE_CUH_
