// Device-side building blocks of the quantization kernels: reading 8 input
// elements as raw 16-byte vectors, converting 4 floats to 4 FP8 bytes,
// transposing an 8x8 byte block in registers, and the block-wide amax
// reduction.
#ifndef FP8KIT_CUDA_QUANTIZE_DEVICE_CUH_
#define FP8KIT_CUDA_QUANTIZE_DEVICE_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "compute_scale.h"
#include "fp8_convert.h"
#include "fp8kit/quantize.h"
#include "fp8kit/tensor.h"
#include "pdl.cuh"

namespace fp8kit {
namespace cuda {

// ---------------------------------------------------------------- input ----
// Raw storage of 8 consecutive input elements: one 16-byte vector for the
// 16-bit formats, two for float32. Keeping the raw bits (not floats) lets
// every load of a tile be issued before any conversion.
template <int kIn>
struct Raw8 {
  static constexpr int kVecs = (kIn == FP8KIT_FLOAT32) ? 2 : 1;
  static constexpr int kBytes = (kIn == FP8KIT_FLOAT32) ? 4 : 2;
  uint4 v[kVecs];
};

__device__ __forceinline__ uint32_t u4_word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ void u4_set_word(uint4& v, int i, uint32_t w) {
  if (i == 0) v.x = w;
  else if (i == 1) v.y = w;
  else if (i == 2) v.z = w;
  else v.w = w;
}

// A bf16 or fp16 element (its 16 bits, the rest 0) as float32. Both widen
// exactly (hardware cvt.f32.f16 is exact too).
template <int kIn>
__device__ __forceinline__ float bits16_to_float(uint32_t h) {
  if constexpr (kIn == FP8KIT_BFLOAT16) {
    return __uint_as_float(h << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  }
}

// Element i (0..7, a compile-time constant after unrolling) as float32.
template <int kIn>
__device__ __forceinline__ float raw_get(const Raw8<kIn>& r, int i) {
  if constexpr (kIn == FP8KIT_FLOAT32) {
    return __uint_as_float(u4_word(r.v[i >> 2], i & 3));
  } else {
    const uint32_t w = u4_word(r.v[0], i >> 1);
    return bits16_to_float<kIn>((i & 1) ? (w >> 16) : (w & 0xffffu));
  }
}

// Raw bits of element `i` of a typed buffer.
template <int kIn>
__device__ __forceinline__ uint32_t load_bits(const void* base, int64_t i) {
  if constexpr (kIn == FP8KIT_FLOAT32) {
    return static_cast<const uint32_t*>(base)[i];
  } else {
    return static_cast<const uint16_t*>(base)[i];
  }
}

// |x| bit pattern of a scalar element as float32 bits (monotone, NaN above
// +inf).
template <int kIn>
__device__ __forceinline__ uint32_t abs_float_bits(uint32_t bits) {
  if constexpr (kIn == FP8KIT_FLOAT32) {
    return bits & 0x7fffffffu;
  } else if constexpr (kIn == FP8KIT_BFLOAT16) {
    return (bits & 0x7fffu) << 16;
  } else {
    const uint32_t h = bits & 0x7fffu;
    if (h > 0x7c00u) return 0x7fffffffu;  // NaN
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
  }
}

// Sets element i of a Raw8 from its raw bits (slow, predicated paths only).
template <int kIn>
__device__ __forceinline__ void raw_set(Raw8<kIn>& r, int i, uint32_t bits) {
  if constexpr (kIn == FP8KIT_FLOAT32) {
    u4_set_word(r.v[i >> 2], i & 3, bits);
  } else {
    uint32_t w = u4_word(r.v[0], i >> 1);
    w = (i & 1) ? ((w & 0xffffu) | (bits << 16)) : ((w & 0xffff0000u) | bits);
    u4_set_word(r.v[0], i >> 1, w);
  }
}

// 8 elements starting at element `idx` with 16-byte loads (idx*size must be
// 16-byte aligned).
template <int kIn>
__device__ __forceinline__ void load_raw8(const void* __restrict__ base, int64_t idx,
                                          Raw8<kIn>& r) {
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const char*>(base) +
                                                  idx * Raw8<kIn>::kBytes);
#pragma unroll
  for (int v = 0; v < Raw8<kIn>::kVecs; ++v) r.v[v] = __ldg(p + v);
}

// Up to 8 elements, element j present when j < valid; absent ones read 0.
template <int kIn>
__device__ __forceinline__ void load_raw8_partial(const void* __restrict__ base, int64_t idx,
                                                  int valid, Raw8<kIn>& r) {
#pragma unroll
  for (int v = 0; v < Raw8<kIn>::kVecs; ++v) r.v[v] = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (j < valid) raw_set<kIn>(r, j, load_bits<kIn>(base, idx + j));
  }
}

// ------------------------------------------------------------ FP8 cast ----
// Four floats to four FP8 bytes (little-endian: a is byte 0). On sm_89+ the
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 instruction rounds to nearest even,
// saturates finite overflow and +-inf to +-max and gives 0x7F for NaN:
// exactly fp8_convert.h's satfinite conversion (tests/cpp/quantize_test.cc
// checks all 2^32 float32 inputs on the GPU). Define
// FP8KIT_FP8_SOFTWARE_CVT to use the software conversion instead.
template <bool kE4M3>
__device__ __forceinline__ uint32_t cvt4(float a, float b, float c, float d) {
#if defined(FP8KIT_FP8_SOFTWARE_CVT) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890)
  auto f = [](float x) -> uint32_t {
    return kE4M3 ? float_to_e4m3_satfinite(x) : float_to_e5m2_satfinite(x);
  };
  return f(a) | (f(b) << 8) | (f(c) << 16) | (f(d) << 24);
#else
  constexpr __nv_fp8_interpretation_t kFmt = kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFmt);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kFmt);
  return lo | (hi << 16);
#endif
}

// Elements x[k .. k+3] times scale[k .. k+3] to four FP8 bytes (x[k] is
// byte 0): quantize_to_fp8 of fp8_convert.h, byte for byte. cvt4 converts
// the products; an infinite element, which satfinite saturates, then gets
// fp8_code_of_inf instead. kFinite leaves that fix-up and its registers
// out, for a caller that knows no element is infinite or that gives
// infinite elements their codes itself (block_cast_tile.cuh).
template <bool kE4M3, bool kFinite = false, int N>
__device__ __forceinline__ uint32_t quantize4(const float (&x)[N], const float (&scale)[N],
                                              int k) {
  float y[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) y[j] = __fmul_rn(x[k + j], scale[k + j]);
  uint32_t q = cvt4<kE4M3>(y[0], y[1], y[2], y[3]);
  if constexpr (kFinite) return q;
  // One test for all four (3 max, a compare) where testing each took 3
  // instructions an element, a tenth of an activation kernel's; fmaxf
  // passes over NaN, which is not infinite.
  const float largest = fmaxf(fmaxf(fabsf(x[k]), fabsf(x[k + 1])),
                              fmaxf(fabsf(x[k + 2]), fabsf(x[k + 3])));
  if (is_inf_float(largest)) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (is_inf_float(x[k + j])) {
        q = (q & ~(0xffu << (8 * j))) | (uint32_t(fp8_code_of_inf<kE4M3>(y[j])) << (8 * j));
      }
    }
  }
  return q;
}

// Eight elements, all with one scale, to eight FP8 bytes (.x = elements
// 0..3); kFinite as for quantize4.
template <bool kE4M3, bool kFinite = false>
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], float scale) {
  float s[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j] = scale;
  return make_uint2(quantize4<kE4M3, kFinite>(x, s, 0), quantize4<kE4M3, kFinite>(x, s, 4));
}

// Scales and casts 8 raw elements to 8 FP8 bytes (.x = elements 0..3), and
// folds their |x| into amax_bits (largest |x| bit pattern: NaN-propagating,
// see amax_cpu.cc).
template <int kIn, bool kE4M3>
__device__ __forceinline__ uint2 cast8(const Raw8<kIn>& r, float scale, uint32_t& amax_bits) {
  float x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[i] = raw_get<kIn>(r, i);
    amax_bits = max(amax_bits, __float_as_uint(x[i]) & 0x7fffffffu);
  }
  return quantize8<kE4M3>(x, scale);
}

// ------------------------------------------------------- 8x8 transpose ----
// a0..a3: four rows of four bytes; returns (in place) four columns of four
// bytes: c_j byte i = a_i byte j.
__device__ __forceinline__ void transpose4x4(uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                             uint32_t& a3) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140);  // a0.b0 a1.b0 a0.b1 a1.b1
  const uint32_t t1 = __byte_perm(a0, a1, 0x7362);  // a0.b2 a1.b2 a0.b3 a1.b3
  const uint32_t t2 = __byte_perm(a2, a3, 0x5140);
  const uint32_t t3 = __byte_perm(a2, a3, 0x7362);
  a0 = __byte_perm(t0, t2, 0x5410);  // a0.b0 a1.b0 a2.b0 a3.b0
  a1 = __byte_perm(t0, t2, 0x7632);  // a0.b1 a1.b1 a2.b1 a3.b1
  a2 = __byte_perm(t1, t3, 0x5410);
  a3 = __byte_perm(t1, t3, 0x7632);
}

// rows[k] holds row k's 8 bytes (.x = columns 0..3); returns cols[j] with
// column j's 8 bytes (.x = rows 0..3).
__device__ __forceinline__ void transpose8x8(const uint2 (&rows)[8], uint2 (&cols)[8]) {
  uint32_t a0 = rows[0].x, a1 = rows[1].x, a2 = rows[2].x, a3 = rows[3].x;  // rows 0-3, cols 0-3
  uint32_t b0 = rows[4].x, b1 = rows[5].x, b2 = rows[6].x, b3 = rows[7].x;  // rows 4-7, cols 0-3
  uint32_t c0 = rows[0].y, c1 = rows[1].y, c2 = rows[2].y, c3 = rows[3].y;  // rows 0-3, cols 4-7
  uint32_t d0 = rows[4].y, d1 = rows[5].y, d2 = rows[6].y, d3 = rows[7].y;  // rows 4-7, cols 4-7
  transpose4x4(a0, a1, a2, a3);
  transpose4x4(b0, b1, b2, b3);
  transpose4x4(c0, c1, c2, c3);
  transpose4x4(d0, d1, d2, d3);
  cols[0] = make_uint2(a0, b0);
  cols[1] = make_uint2(a1, b1);
  cols[2] = make_uint2(a2, b2);
  cols[3] = make_uint2(a3, b3);
  cols[4] = make_uint2(c0, d0);
  cols[5] = make_uint2(c1, d1);
  cols[6] = make_uint2(c2, d2);
  cols[7] = make_uint2(c3, d3);
}

// Byte i (compile-time after unrolling) of a vector.
__device__ __forceinline__ uint8_t u2_byte(const uint2& v, int i) {
  return uint8_t(((i < 4) ? v.x : v.y) >> (8 * (i & 3)));
}
__device__ __forceinline__ uint8_t u4_byte(const uint4& v, int i) {
  return uint8_t(u4_word(v, i >> 2) >> (8 * (i & 3)));
}

// ------------------------------------------------------------- amax ----
// Largest |x| bit pattern of the block, then one atomicMax on the float
// bits of *amax (zeroed before the launch). Unsigned order is value order
// for non-negative floats, and NaN patterns lie above +inf; a block's NaN is
// made the canonical quiet NaN 0x7FC00000 (still above +inf), so the
// final NaN does not depend on block order and is the one the CPU writes.
// `warp_max` is __shared__ with one slot per warp. Must be called by every
// thread of the block; the caller provides the __syncthreads() between
// amax_block_publish and amax_block_commit. The atomic waits (pdl_wait) for
// the kernel that zeroed *amax when this one was launched with launch_pdl.
__device__ __forceinline__ void amax_block_publish(uint32_t amax_bits, uint32_t* warp_max) {
  const uint32_t m = __reduce_max_sync(0xffffffffu, amax_bits);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
}

template <int kWarps>
__device__ __forceinline__ void amax_block_commit(const uint32_t* warp_max, float* amax) {
  if (threadIdx.x == 0) {
    uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = max(m, warp_max[w]);
    if (m > 0x7f800000u) m = 0x7fc00000u;
    pdl_wait();
    if (m != 0) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
  }
}

// The per-tensor scale a cast kernel uses: the given one (delayed scaling;
// a fresh slot's seed, see fp8kit_quantize_delayed_update), or the one
// current scaling derives from the amax the previous pass wrote. Made by
// delayed_scale_source / current_scale_source below.
struct ScaleSource {
  const float* scale;      // delayed scaling: read; NULL for current scaling
  const float* amax_in;    // current scaling: the finished amax
  float fp8_max;
  float amax_epsilon;      // current scaling
  int power_2_scale;       // current scaling
  float* scale_out;        // current scaling: block 0 writes the scale here
  float* scale_inv_out;    // block 0 writes 1/scale here when non-NULL
  const float* seeded;       // delayed scaling: the slot's flag (0: fresh) or NULL
  const float* seed_amax;  // delayed scaling, fresh slot: the amax of the seed
  int margin;              // delayed scaling: the seed's margin
};

inline ScaleSource delayed_scale_source(const float* scale, float fp8_max, float* scale_inv_out) {
  ScaleSource s{};
  s.scale = scale;
  s.fp8_max = fp8_max;
  s.scale_inv_out = scale_inv_out;
  return s;
}

inline ScaleSource current_scale_source(const float* amax, float fp8_max,
                                        const fp8kit_current_scaling_config& config,
                                        float* scale_out, float* scale_inv_out) {
  ScaleSource s{};
  s.amax_in = amax;
  s.fp8_max = fp8_max;
  s.amax_epsilon = config.amax_epsilon;
  s.power_2_scale = config.power_2_scale;
  s.scale_out = scale_out;
  s.scale_inv_out = scale_inv_out;
  return s;
}

// Current scaling reads the amax the previous kernel (the amax pass)
// wrote, so it waits for that kernel first (see pdl.cuh); the loads of the
// input may already be in flight. A fresh delayed-scaling slot reads the
// amax the seeding pre-pass (an earlier, ordinary launch) accumulated.
// `first_block`: this block is the first of its tensor, whose thread 0
// writes scale_out / scale_inv_out.
__device__ __forceinline__ float read_scale(const ScaleSource& s, bool first_block) {
  float scale;
  if (s.scale == nullptr) {
    pdl_wait();
    scale = current_scale_from_amax(*s.amax_in, s.fp8_max, s.amax_epsilon, s.power_2_scale != 0);
  } else {
    scale = *s.scale;
    if (s.seeded != nullptr && *s.seeded == 0.0f) {
      scale = delayed_scale_from_amax(*s.seed_amax, scale, s.fp8_max, s.margin);
    }
    scale = checked_scale(scale);  // a bad given scale: NaN (fp8kit/quantize.h)
  }
  if (first_block && threadIdx.x == 0) {
    if (s.scale_out != nullptr) *s.scale_out = scale;
    if (s.scale_inv_out != nullptr) *s.scale_inv_out = reciprocal(scale);
  }
  return scale;
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_QUANTIZE_DEVICE_CUH_
