// Bit-level conversions of the 16-bit float formats to float32, shared by
// the CPU reference and the CUDA kernels (host and device inline) so both
// read inputs identically.
#ifndef FP8KIT_SRC_FLOAT_BITS_H_
#define FP8KIT_SRC_FLOAT_BITS_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8KIT_HD __host__ __device__ __forceinline__
#else
#define FP8KIT_HD inline
#endif

namespace fp8kit {

FP8KIT_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

FP8KIT_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

// bfloat16 is the top half of a float32: exact.
FP8KIT_HD float bf16_bits_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// IEEE binary16 to float32: exact for every input, denormals and NaN included.
FP8KIT_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);  // +-0
  // Denormal: normalise the mantissa.
  uint32_t e = 113u;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_to_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_FLOAT_BITS_H_
