#include "fused_cast_validate.h"

#include <string>

#include "column_sums_cpu.h"
#include "error.h"
#include "quantize_validate.h"
#include "validate.h"

namespace fp8kit {

void check_fused_aligned(const char* op, const char* arg, const void* p) {
  FP8KIT_CHECK(reinterpret_cast<uintptr_t>(p) % kFusedAlign == 0, op, ": ", arg,
               " is not 16-byte aligned; the fused kernels read and write 16-byte vectors, so "
               "pass a pointer to a 16-byte boundary (a fresh allocation is)");
}

void check_like(const char* op, const char* arg, const fp8kit_tensor* t, fp8kit_dtype dtype,
                const fp8kit_tensor& like, const char* like_arg) {
  check_tensor(op, arg, t);
  FP8KIT_CHECK(t->dtype == dtype, op, ": ", arg, " has dtype ", fp8kit_dtype_name(t->dtype),
               "; it must be ", fp8kit_dtype_name(dtype), " (", like_arg, "'s dtype)");
  check_same_device(op, arg, *t, like_arg, like);
  check_same_shape(op, arg, *t, like_arg, like);
  check_fused_aligned(op, (std::string(arg) + "->data").c_str(), t->data);
}

void check_vector(const char* op, const char* arg, const fp8kit_tensor* t, fp8kit_dtype dtype,
                  int64_t length, const fp8kit_tensor& like, const char* like_arg) {
  check_tensor(op, arg, t);
  FP8KIT_CHECK(t->dtype == dtype, op, ": ", arg, " has dtype ", fp8kit_dtype_name(t->dtype),
               "; it must be ", fp8kit_dtype_name(dtype));
  FP8KIT_CHECK(t->rank == 1 && t->shape[0] == length, op, ": ", arg, " has shape ",
               shape_string(*t), "; it must be [", length, "]");
  check_same_device(op, arg, *t, like_arg, like);
}

void check_fused_cast(const char* op, const char* out_arg, const fp8kit_tensor* out,
                      const fp8kit_fused_cast* cast, const fp8kit_column_sums* sums,
                      const fp8kit_tensor& values, const char* values_arg) {
  const std::string o = out_arg;
  FP8KIT_CHECK(cast != nullptr, op, ": cast is NULL; pass a fp8kit_fused_cast (the recipe of ",
               out_arg, ")");
  check_tensor(op, out_arg, out, /*allow_null_data=*/true);
  check_fp8(op, out_arg, *out);
  check_per_tensor_mode(op, out_arg, *out);
  check_same_device(op, out_arg, *out, values_arg, values);
  check_same_shape(op, out_arg, *out, values_arg, values);
  FP8KIT_CHECK(fp8kit_tensor_numel(out) == 0 || out->data != nullptr ||
                   out->columnwise_data != nullptr,
               op, ": ", out_arg, " has neither data nor columnwise_data; set at least one of "
               "them (data for the rowwise copy, columnwise_data for the transposed copy)");
  check_fused_aligned(op, (o + "->data").c_str(), out->data);
  check_fused_aligned(op, (o + "->columnwise_data").c_str(), out->columnwise_data);
  switch (cast->recipe) {
    case FP8KIT_FUSED_CAST_DELAYED:
      check_delayed_scaling_config(op, &cast->delayed_config);
      check_delayed_quantize_state(op, "cast->state", cast->state, cast->delayed_config);
      FP8KIT_CHECK(out->scale == nullptr && out->amax == nullptr, op, ": ", out_arg,
                   " has scale or amax set; under delayed scaling leave them NULL (the scale "
                   "is read from and the amax accumulated into cast->state)");
      break;
    case FP8KIT_FUSED_CAST_CURRENT:
      check_current_scaling_config(op, &cast->current_config);
      FP8KIT_CHECK(out->scale != nullptr && out->scale_inv != nullptr && out->amax != nullptr,
                   op, ": ", out_arg, " needs scale, scale_inv and amax under current scaling "
                   "(each 1 float, all written); one of them is NULL");
      break;
    default:
      fail(FP8KIT_INVALID_ARGUMENT, op, ": cast->recipe is ", int(cast->recipe),
           "; use FP8KIT_FUSED_CAST_DELAYED or FP8KIT_FUSED_CAST_CURRENT");
  }
  if (sums != nullptr) {
    check_column_sums(op, "sums", values_arg, o + "->columnwise_data", values, *out, *sums);
  }
}

bool check_optional_fused_cast(const char* op, const char* hp_arg, const fp8kit_tensor* hp,
                               const char* out_arg, const fp8kit_tensor* out,
                               const fp8kit_fused_cast* cast, const fp8kit_column_sums* sums,
                               const fp8kit_tensor& values, const char* values_arg) {
  if (out != nullptr) {
    check_fused_cast(op, out_arg, out, cast, sums, values, values_arg);
    return true;
  }
  FP8KIT_CHECK(hp != nullptr, op, ": ", hp_arg, " and ", out_arg, " are both NULL; pass ",
               hp_arg, " for the high-precision output, ", out_arg, " for the FP8 one, or both");
  FP8KIT_CHECK(cast == nullptr, op, ": cast is given but ", out_arg, " is NULL; pass ", out_arg,
               " to cast, or cast = NULL for the high-precision output alone");
  FP8KIT_CHECK(sums == nullptr, op, ": sums are asked for but ", out_arg, " is NULL; the column "
               "sums come with the cast (pass ", out_arg, " with columnwise_data)");
  return false;
}

}  // namespace fp8kit
