// The FP8 Linear layer's C++ half: its scaling state (LinearState) and an
// autograd function whose forward (quantize input and weight, FP8 GEMM with
// the bias epilogue) and backward (quantize grad_output, dgrad and wgrad
// FP8 GEMMs, bias grad) run in C++ with one Python -> C++ call per forward
// and no Python at all in backward. fp8kit/torch/linear.py is the module.
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
