// What the grouped FFI handlers share (grouped_ffi.cc, grouped_delayed_ffi.cc,
// grouped_block_ffi.cc): reading the group sizes and the per-group
// scales, and the FP8 type of a result. grouped_ffi.cc says how the
// buffers are laid out.
#ifndef FP8KIT_JAX_EXT_GROUPED_FFI_H_
#define FP8KIT_JAX_EXT_GROUPED_FFI_H_

#include <cstdint>

#include "ffi_helpers.h"
#include "fp8kit/grouped.h"

namespace fp8kit_jax {

// Floats from one group's scale to the next in a per-group scale buffer.
inline constexpr int64_t kStride = FP8KIT_GROUP_SCALE_STRIDE;

// Describes group_sizes (int64 [E], or int32 [E, 2] word pairs: see
// grouped_ffi.cc) as the core's int64 [E]; *groups = E.
ffi::ErrorOr<fp8kit_tensor> DescribeGroupSizes(const char* op, ffi::AnyBuffer sizes,
                                               const Device& device, int64_t* groups);

// A per-group scale buffer (argument or result) must be float32 [E, kStride]:
// the core trusts the pointer with E * kStride floats.
ffi::Error CheckGroupScales(const char* op, const char* arg, ffi::AnyBuffer t, int64_t groups);

// The FP8 type of an FP8 buffer (E4M3 or E5M2), else an error naming `arg`.
ffi::ErrorOr<fp8kit_dtype> GroupFp8Type(const char* op, const char* arg, ffi::AnyBuffer t);

// The per-tensor FP8 output descriptor of a grouped cast of `input` [T, F]
// in `groups` groups: the rowwise result `data` (input's shape) and/or the
// flat grouped columnwise copy, each checked when asked for; the FP8 type
// is theirs. Scale, scale_inv and amax are left to the caller.
ffi::ErrorOr<fp8kit_tensor> DescribeGroupedOutput(const char* op, const fp8kit_tensor& input,
                                                  int64_t groups, ffi::AnyBuffer data,
                                                  ffi::AnyBuffer columnwise, bool rowwise,
                                                  bool want_columnwise);

}  // namespace fp8kit_jax

#endif  // FP8KIT_JAX_EXT_GROUPED_FFI_H_
