#include "validate.h"

#include <sstream>

#include "error.h"
#include "fp8kit/device.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {

bool is_high_precision(fp8kit_dtype dtype) {
  return dtype == FP8KIT_FLOAT32 || dtype == FP8KIT_BFLOAT16 || dtype == FP8KIT_FLOAT16;
}

bool is_fp8(fp8kit_dtype dtype) { return dtype == FP8KIT_E4M3 || dtype == FP8KIT_E5M2; }

std::string shape_string(const fp8kit_tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.rank; ++i) os << (i ? ", " : "") << t.shape[i];
  os << "]";
  return os.str();
}

void flatten_2d(const fp8kit_tensor& t, int64_t* rows, int64_t* cols) {
  if (t.rank == 0) {
    *rows = 1;
    *cols = 1;
    return;
  }
  int64_t r = 1;
  for (int i = 0; i + 1 < t.rank; ++i) r *= t.shape[i];
  *rows = r;
  *cols = t.shape[t.rank - 1];
}

void check_not_null(const char* op, const char* arg, const void* p) {
  FP8KIT_CHECK(p != nullptr, op, ": ", arg, " is NULL; pass a valid pointer");
}

void check_device_usable(const char* op, fp8kit_device_type device_type, int device_index) {
  if (device_type == FP8KIT_DEVICE_CPU) return;
  FP8KIT_CHECK(device_type == FP8KIT_DEVICE_CUDA, op, ": unknown device type ",
               int(device_type), "; use FP8KIT_DEVICE_CPU or FP8KIT_DEVICE_CUDA");
#ifdef FP8KIT_WITH_CUDA
  const int count = cuda::device_count();
  FP8KIT_CHECK(device_index >= 0 && device_index < count, op, ": CUDA device ", device_index,
               " does not exist (", count, " visible)");
#else
  (void)device_index;
  fail(FP8KIT_UNSUPPORTED, op,
       ": got a CUDA tensor but this fp8kit build has no CUDA support; rebuild with a CUDA "
       "toolkit (see README) or move the tensor to the CPU");
#endif
}

void check_tensor(const char* op, const char* arg, const fp8kit_tensor* t, bool allow_null_data) {
  FP8KIT_CHECK(t != nullptr, op, ": ", arg, " descriptor is NULL");
  FP8KIT_CHECK(t->rank >= 0 && t->rank <= FP8KIT_MAX_RANK, op, ": ", arg, " has rank ", t->rank,
               "; fp8kit supports ranks 0..", FP8KIT_MAX_RANK);
  for (int i = 0; i < t->rank; ++i) {
    FP8KIT_CHECK(t->shape[i] >= 0, op, ": ", arg, " has negative dimension ", t->shape[i],
                 " in shape ", shape_string(*t));
  }
  FP8KIT_CHECK(fp8kit_dtype_size(t->dtype) != 0, op, ": ", arg, " has unknown dtype code ",
               int(t->dtype));
  check_device_usable(op, t->device_type, t->device_index);
  if (!allow_null_data && fp8kit_tensor_numel(t) > 0) {
    FP8KIT_CHECK(t->data != nullptr, op, ": ", arg, " has ", fp8kit_tensor_numel(t),
                 " elements but its data pointer is NULL");
  }
}

void check_high_precision(const char* op, const char* arg, const fp8kit_tensor& t) {
  FP8KIT_CHECK(is_high_precision(t.dtype), op, ": ", arg, " has dtype ",
               fp8kit_dtype_name(t.dtype), "; expected float32, bfloat16 or float16");
}

void check_fp8(const char* op, const char* arg, const fp8kit_tensor& t) {
  FP8KIT_CHECK(is_fp8(t.dtype), op, ": ", arg, " has dtype ", fp8kit_dtype_name(t.dtype),
               "; expected e4m3 or e5m2");
}

void check_same_device(const char* op, const char* arg_a, const fp8kit_tensor& a,
                       const char* arg_b, const fp8kit_tensor& b) {
  FP8KIT_CHECK(a.device_type == b.device_type &&
                   (a.device_type == FP8KIT_DEVICE_CPU || a.device_index == b.device_index),
               op, ": ", arg_a, " and ", arg_b,
               " are on different devices; move them to the same device");
}

void check_same_shape(const char* op, const char* arg_a, const fp8kit_tensor& a,
                      const char* arg_b, const fp8kit_tensor& b) {
  bool same = a.rank == b.rank;
  for (int i = 0; same && i < a.rank; ++i) same = a.shape[i] == b.shape[i];
  FP8KIT_CHECK(same, op, ": ", arg_a, " has shape ", shape_string(a), " but ", arg_b,
               " has shape ", shape_string(b), "; they must match");
}

}  // namespace fp8kit
