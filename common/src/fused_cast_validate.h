// Argument checks shared by the fused ops (normalization, activations) on
// the CPU and CUDA paths: the fused cast (fp8kit/fused_cast.h) and the
// plain tensors around it. Each throws fp8kit::Error naming the op, the
// argument and the fix.
#ifndef FP8KIT_SRC_FUSED_CAST_VALIDATE_H_
#define FP8KIT_SRC_FUSED_CAST_VALIDATE_H_

#include <cstdint>

#include "fp8kit/column_sums.h"
#include "fp8kit/fused_cast.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// The alignment every data pointer of a fused op has (16-byte vectors).
constexpr uintptr_t kFusedAlign = 16;

// `t` is a valid descriptor (check_tensor) in `dtype` with `like`'s shape
// and device and 16-byte aligned data.
void check_like(const char* op, const char* arg, const fp8kit_tensor* t, fp8kit_dtype dtype,
                const fp8kit_tensor& like, const char* like_arg);

// `t` is a valid rank-1 [length] tensor in `dtype` on `like`'s device.
void check_vector(const char* op, const char* arg, const fp8kit_tensor* t, fp8kit_dtype dtype,
                  int64_t length, const fp8kit_tensor& like, const char* like_arg);

// p is NULL or kFusedAlign-aligned.
void check_fused_aligned(const char* op, const char* arg, const void* p);

// `out` and `cast` describe a fused cast of a float32 tensor with
// `values`'s shape and device (`values_arg` names it in messages): what
// fp8kit_quantize_delayed_update (one slot) or
// fp8kit_quantize_current_scaling would accept for that tensor, plus
// 16-byte aligned FP8 data. `sums`: NULL or column sums with a non-NULL
// `sums` field.
void check_fused_cast(const char* op, const char* out_arg, const fp8kit_tensor* out,
                      const fp8kit_fused_cast* cast, const fp8kit_column_sums* sums,
                      const fp8kit_tensor& values, const char* values_arg);

// The outputs of a fused op that may skip its cast: with `out` NULL the op
// writes only its high-precision output `hp` (which must then be given,
// `cast` and `sums` NULL); otherwise check_fused_cast. Returns whether the
// op casts.
bool check_optional_fused_cast(const char* op, const char* hp_arg, const fp8kit_tensor* hp,
                               const char* out_arg, const fp8kit_tensor* out,
                               const fp8kit_fused_cast* cast, const fp8kit_column_sums* sums,
                               const fp8kit_tensor& values, const char* values_arg);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_FUSED_CAST_VALIDATE_H_
