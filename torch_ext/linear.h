// The FP8 Linear layer's C++ half, with one Python -> C++ call per forward
// and no Python at all in backward (fp8kit/torch/linear.py is the module):
//   linear_recipe   the recipe, read from the fp8kit.recipe object
//   linear_state    LinearState: scaling state, weight cache, checkpoints
//   linear_forward  quantize input and weight, FP8 GEMM with the bias
//                   epilogue, the autograd node
//   linear_backward quantize grad_output, dgrad and wgrad FP8 GEMMs, bias grad
//   node_maker      the torch-version shim for making autograd nodes
//   linear.cc       the Python bindings
//
// Activations are saved for backward in FP8 (the input's columnwise copy,
// or its rowwise data where the device reads non-TN layouts), never in
// high precision.
#ifndef FP8KIT_TORCH_EXT_LINEAR_H_
#define FP8KIT_TORCH_EXT_LINEAR_H_

#include "torch_includes.h"

namespace fp8kit_torch {

void register_linear(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_LINEAR_H_
