// Bindings of the core's fused ops and the pieces the fused layers
// (fp8kit.torch.LayerNormLinear, LayerNormMLP) build on:
//   normalization.cc   norm_forward / norm_backward (fp8kit/normalization.h)
//   activation.cc      activation_forward / activation_backward
//                      (fp8kit/activation.h)
//   fused_layer_ops.cc quantize_slot (a weight or gradient cast into a
//                      LinearState slot) and linear_plan (the core's plan
//                      of which FP8 copies a GEMM pair writes and keeps)
//   fused_linear.cc    the Linear's forward and backward on an input or a
//                      gradient already cast (linear_forward_cast_input,
//                      linear_backward, linear_backward_cast_grad)
// Every FP8 output is cast as fp8kit/fused_cast.h says, with the recipe and
// (delayed scaling) the scaling state of one slot of a LinearState
// (fused_cast.h). One C++ call per kernel.
#ifndef FP8KIT_TORCH_EXT_FUSED_OPS_H_
#define FP8KIT_TORCH_EXT_FUSED_OPS_H_

#include <optional>
#include <string>
#include <tuple>

#include "fused_cast.h"
#include "linear_autograd.h"
#include "torch_includes.h"

namespace fp8kit_torch {

// The ops on typed arguments, each checking them (errors name `fn` and the
// argument): the pybind11 bindings read Python values into these, and the
// dispatcher ops (fused_dispatcher_ops.cc) call them with a LinearState
// over the layer's state tensors. An output not asked for is undefined.
struct NormForwardOut {
  FusedCastOut cast;
  at::Tensor mean, rsigma, y;  // mean: LayerNorm only
};
NormForwardOut norm_forward(const char* fn, const at::Tensor& x, const at::Tensor& gamma,
                            const at::Tensor& beta, const std::string& normalization,
                            double epsilon, const CastArgs& cast, bool want_y);
// The norm without a cast (BlockScaling's layers cast its output per block
// themselves): (y in x's dtype, mean (undefined for RMSNorm), rsigma).
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_forward_values(
    const char* fn, const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
    const std::string& normalization, double epsilon);
// (dx, dgamma, dbeta); dbeta undefined for RMSNorm, as `mean` must be.
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(
    const char* fn, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean,
    const at::Tensor& rsigma, const at::Tensor& gamma, const std::string& normalization,
    double epsilon);

struct ActivationForwardOut {
  FusedCastOut cast;
  at::Tensor a;
};
ActivationForwardOut activation_forward(const char* fn, const at::Tensor& h,
                                        const std::string& activation, const CastArgs& cast,
                                        bool want_a);
// The activation and its gradient without a cast: a, and dh, in h's dtype.
at::Tensor activation_forward_values(const char* fn, const at::Tensor& h,
                                     const std::string& activation);
at::Tensor activation_backward_values(const char* fn, const at::Tensor& d_a, const at::Tensor& h,
                                      const std::string& activation);
struct ActivationBackwardOut {
  FusedCastOut cast;
  at::Tensor sums, dh;
};
ActivationBackwardOut activation_backward(const char* fn, const at::Tensor& d_a,
                                          const at::Tensor& h, const std::string& activation,
                                          const CastArgs& cast,
                                          std::optional<at::ScalarType> sums_dtype,
                                          bool want_dh);

struct QuantizeSlotOut {
  FusedCastOut cast;
  at::Tensor sums;
};
QuantizeSlotOut quantize_slot(const char* fn, const at::Tensor& x, const CastArgs& cast,
                              std::optional<at::ScalarType> sums_dtype);

// fp8kit.torch.Linear's forward below autograd on an input a fused kernel
// has already cast into st's input slot (linear_autograd.h, CastInput):
// y, and, when `record`, the weight copy the plan keeps for the gradients
// dgrad / wgrad (undefined when none) and its scale_inv. own_buffers: as
// LinearSaved's (a dispatcher op's call). out_dtype: y's (none: the
// weight's; a float32 weight beside a bf16 layer under torch.autocast).
struct CastInputForwardOut {
  at::Tensor y, w_q, w_scale_inv;
};
CastInputForwardOut linear_forward_cast_input(const char* fn, LinearState& st, const CastInput& x,
                                              const at::Tensor& w, const at::Tensor& b,
                                              const FP8Weight* fp8_weight,
                                              bool fast_accumulation, bool record, bool dgrad,
                                              bool wgrad, const at::Tensor& statistics,
                                              bool own_buffers,
                                              std::optional<at::ScalarType> out_dtype);

// The pybind11 bindings.

void register_normalization(pybind11::module_& m);
void register_activation(pybind11::module_& m);
void register_fused_layer_ops(pybind11::module_& m);
void register_fused_linear(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_FUSED_OPS_H_
