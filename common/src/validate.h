// Input checks shared by the CPU and CUDA paths, so that whatever passes on
// CPU runs on GPU. Each throws fp8kit::Error with a message that names the
// op, the argument and the fix.
#ifndef FP8KIT_SRC_VALIDATE_H_
#define FP8KIT_SRC_VALIDATE_H_

#include <cstdint>
#include <string>

#include "fp8kit/tensor.h"

namespace fp8kit {

bool is_high_precision(fp8kit_dtype dtype);  // float32, bfloat16, float16
bool is_fp8(fp8kit_dtype dtype);             // E4M3, E5M2

// Descriptor is non-null, rank in range, shape non-negative, device known,
// and data non-null when the tensor has elements (unless allow_null_data).
void check_tensor(const char* op, const char* arg, const fp8kit_tensor* t,
                  bool allow_null_data = false);
void check_high_precision(const char* op, const char* arg, const fp8kit_tensor& t);
void check_fp8(const char* op, const char* arg, const fp8kit_tensor& t);
void check_same_device(const char* op, const char* arg_a, const fp8kit_tensor& a,
                       const char* arg_b, const fp8kit_tensor& b);
void check_same_shape(const char* op, const char* arg_a, const fp8kit_tensor& a,
                      const char* arg_b, const fp8kit_tensor& b);
void check_not_null(const char* op, const char* arg, const void* p);
// Fails with FP8KIT_UNSUPPORTED for CUDA tensors in a CPU-only build and
// FP8KIT_INVALID_ARGUMENT for a CUDA ordinal that does not exist.
void check_device_usable(const char* op, fp8kit_device_type device_type, int device_index);

// "[2, 3, 4]"
std::string shape_string(const fp8kit_tensor& t);

// The [rows, cols] view used by the columnwise layout: rows =
// prod(shape[:-1]), cols = shape[-1]; rank 0 is [1, 1].
void flatten_2d(const fp8kit_tensor& t, int64_t* rows, int64_t* cols);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_VALIDATE_H_
