// Independent FP8 and fp16 decoders for the tests, written from the format
// definitions with ldexp (not with the code under test), shared by the
// quantization and GEMM test helpers.
#ifndef FP8KIT_TESTS_CPP_REFERENCE_DECODE_H_
#define FP8KIT_TESTS_CPP_REFERENCE_DECODE_H_

#include <cmath>
#include <cstdint>

#include "fp8kit/tensor.h"

namespace testref {

// The value of one E4M3 or E5M2 byte.
inline double decode_fp8(uint8_t b, fp8kit_dtype dtype) {
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (dtype == FP8KIT_E4M3) {
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    return sign * (e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
  }
  const int e = (b >> 2) & 31, m = b & 3;
  if (e == 31) return m == 0 ? sign * INFINITY : NAN;
  return sign * (e == 0 ? std::ldexp(m, -16) : std::ldexp(4 + m, e - 17));
}

// The value of one IEEE binary16.
inline double decode_fp16(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return m == 0 ? sign * INFINITY : NAN;
  return sign * (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25));
}

}  // namespace testref

#endif  // FP8KIT_TESTS_CPP_REFERENCE_DECODE_H_
