// Descriptor helpers: construction, element counts, dtype facts.
#include "fp8kit/tensor.h"

#include <cstring>

extern "C" {

fp8kit_tensor fp8kit_tensor_make(fp8kit_device_type device_type, int device_index,
                                 fp8kit_dtype dtype, int rank, const int64_t* shape,
                                 void* data) {
  fp8kit_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.device_type = device_type;
  t.device_index = device_index;
  t.dtype = dtype;
  t.rank = rank;
  for (int i = 0; i < rank && i < FP8KIT_MAX_RANK && shape != nullptr; ++i) t.shape[i] = shape[i];
  t.data = data;
  t.scaling_mode = FP8KIT_SCALING_NONE;
  return t;
}

int64_t fp8kit_tensor_numel(const fp8kit_tensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; ++i) n *= t->shape[i];
  return n;
}

size_t fp8kit_dtype_size(fp8kit_dtype dtype) {
  switch (dtype) {
    case FP8KIT_INT64: return 8;
    case FP8KIT_FLOAT32: return 4;
    case FP8KIT_BFLOAT16:
    case FP8KIT_FLOAT16: return 2;
    case FP8KIT_E4M3:
    case FP8KIT_E5M2: return 1;
  }
  return 0;
}

const char* fp8kit_dtype_name(fp8kit_dtype dtype) {
  switch (dtype) {
    case FP8KIT_FLOAT32: return "float32";
    case FP8KIT_BFLOAT16: return "bfloat16";
    case FP8KIT_FLOAT16: return "float16";
    case FP8KIT_E4M3: return "e4m3";
    case FP8KIT_E5M2: return "e5m2";
    case FP8KIT_INT64: return "int64";
  }
  return "unknown";
}

float fp8kit_fp8_max(fp8kit_dtype dtype) {
  switch (dtype) {
    case FP8KIT_E4M3: return 448.0f;
    case FP8KIT_E5M2: return 57344.0f;
    default: return 0.0f;
  }
}

}  // extern "C"
