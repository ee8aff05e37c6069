// The kernels of the dispatcher ops fp8kit::linear_forward and
// fp8kit::linear_backward (linear_dispatcher_ops.cc) and of the fused
// layers' steps (fused_dispatcher_ops.cc), registered with the other ops'
// in dispatcher_ops.cc, and how those ops read a layer's scaling state.
#ifndef FP8KIT_TORCH_EXT_LINEAR_DISPATCHER_OPS_H_
#define FP8KIT_TORCH_EXT_LINEAR_DISPATCHER_OPS_H_

#include <torch/library.h>

#include <string>

#include "linear_recipe.h"

namespace fp8kit_torch {

// The schema arguments of a layer's scaling state (LinearState.tensors,
// updated in place) and its recipe (LinearState.recipe's plain values).
#define FP8KIT_STATE_SCHEMA_ARGS                                                                \
  "Tensor(a!) amax_history, Tensor(b!) amax, Tensor(c!) scale, Tensor(d!) scale_inv, "         \
  "Tensor(e!) counters, Tensor(f!) seeded, str scaling, str forward_dtype, str "               \
  "backward_dtype, int margin, str amax_reduction, float amax_epsilon, bool power_2_scale"

// The recipe those values describe (ValueError naming `fn` and the value).
LinearRecipe recipe_of(const char* fn, const std::string& scaling,
                       const std::string& forward_dtype, const std::string& backward_dtype,
                       int64_t amax_history_len, int64_t margin,
                       const std::string& amax_reduction, double amax_epsilon,
                       bool power_2_scale);
// Checks the state tensors: float32 [3, H] history and float32 [3] amax,
// scale, scale_inv and seeded, int32 [3] counters, contiguous, one device.
void check_state(const char* fn, const at::Tensor& history, const at::Tensor& amax,
                 const at::Tensor& scale, const at::Tensor& scale_inv, const at::Tensor& counters,
                 const at::Tensor& seeded);

void register_linear_kernels(torch::Library& m);
void register_fused_kernels(torch::Library& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_LINEAR_DISPATCHER_OPS_H_
