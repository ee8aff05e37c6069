// What the grouped dispatcher ops (grouped_ops.cc, grouped_block_ops.cc)
// share: the group sizes' checks and descriptor, and the outputs of a
// per-tensor grouped cast (fp8kit/grouped.h).
#ifndef FP8KIT_TORCH_EXT_GROUPED_ARGS_H_
#define FP8KIT_TORCH_EXT_GROUPED_ARGS_H_

#include "torch_includes.h"

namespace fp8kit_torch {

// group_sizes: int64 [E], E >= 1, contiguous, on the CPU or x's device.
// Returns E. Errors name `fn`.
int64_t check_group_sizes(const char* fn, const at::Tensor& sizes, const at::Tensor& x);

// The core's descriptor of checked group sizes.
fp8kit_tensor describe_group_sizes(const at::Tensor& sizes);

// A per-tensor grouped cast of x [T, F] (sorted by group): its outputs,
// allocated on x's device (the copies asked for, else empty [0] tensors;
// the per-group scalars [E, GROUP_SCALE_STRIDE] as zeros, since the floats
// between the groups' values are never written and every output of a
// functional op must be defined), and the descriptors of input and output
// with every pointer but output.scale set.
struct GroupedCast {
  at::Tensor x, data, columnwise, scale_inv, amax;
  int64_t groups;
  fp8kit_device_type device;
  fp8kit_tensor input, output;
};

// Checks the arguments every grouped cast takes (the FP8 dtype, at least
// one copy, x a 2-D high-precision tensor, the group sizes) and allocates.
GroupedCast grouped_cast(const char* fn, const at::Tensor& x, const at::Tensor& group_sizes,
                         at::ScalarType fp8_dtype, bool rowwise, bool columnwise);

// Per-group scalars of an FP8 operand: float32 [E, GROUP_SCALE_STRIDE],
// contiguous, on ref's device.
void check_group_scales(const char* fn, const char* arg, const at::Tensor& t, int64_t groups,
                        const at::Tensor& ref);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_GROUPED_ARGS_H_
