// Bindings of the core's fused ops and the pieces the fused layers
// (fp8kit.torch.LayerNormLinear, LayerNormMLP) build on:
//   normalization.cc   norm_forward / norm_backward (fp8kit/normalization.h)
//   activation.cc      activation_forward / activation_backward
//                      (fp8kit/activation.h)
//   fused_layer_ops.cc quantize_slot (a weight or gradient cast into a
//                      LinearState slot) and linear_plan (the core's plan
//                      of which FP8 copies a GEMM pair writes and keeps)
// Every FP8 output is cast as fp8kit/fused_cast.h says, with the recipe and
// (delayed scaling) the scaling state of one slot of a LinearState
// (fused_cast.h). One C++ call per kernel.
#ifndef FP8KIT_TORCH_EXT_FUSED_OPS_H_
#define FP8KIT_TORCH_EXT_FUSED_OPS_H_

#include "torch_includes.h"

namespace fp8kit_torch {

void register_normalization(pybind11::module_& m);
void register_activation(pybind11::module_& m);
void register_fused_layer_ops(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_FUSED_OPS_H_
