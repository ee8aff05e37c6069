// The kernels of the dispatcher ops fp8kit::linear_forward and
// fp8kit::linear_backward (linear_dispatcher_ops.cc), registered with the
// other ops' in dispatcher_ops.cc.
#ifndef FP8KIT_TORCH_EXT_LINEAR_DISPATCHER_OPS_H_
#define FP8KIT_TORCH_EXT_LINEAR_DISPATCHER_OPS_H_

#include <torch/library.h>

namespace fp8kit_torch {

void register_linear_kernels(torch::Library& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_LINEAR_DISPATCHER_OPS_H_
