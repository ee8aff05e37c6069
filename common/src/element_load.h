// Element i of a float32/bfloat16/float16 buffer as float32 (exact): the
// CPU references' typed loads, one struct per input dtype so the loops
// that use them are compiled per dtype.
#ifndef FP8KIT_SRC_ELEMENT_LOAD_H_
#define FP8KIT_SRC_ELEMENT_LOAD_H_

#include <cstdint>

#include "float_bits.h"

namespace fp8kit {

struct LoadF32 {
  static float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
struct LoadBF16 {
  static float load(const void* p, int64_t i) {
    return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
  }
};
struct LoadF16 {
  static float load(const void* p, int64_t i) {
    return fp16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
  }
};

}  // namespace fp8kit

#endif  // FP8KIT_SRC_ELEMENT_LOAD_H_
