// The FP8 Linear's forward and backward (linear_forward.cc,
// linear_backward.cc), the autograd node that connects them, and the same
// two steps below autograd for the dispatcher ops (linear_dispatcher_ops.cc).
#ifndef FP8KIT_TORCH_EXT_LINEAR_AUTOGRAD_H_
#define FP8KIT_TORCH_EXT_LINEAR_AUTOGRAD_H_

#include <optional>
#include <string>
#include <vector>

#include "linear_state.h"
#include "torch_includes.h"

namespace fp8kit_torch {

// What one call computes, and the core's plan of which copies each slot's
// cast writes and which forward keeps (fp8kit_linear_plan_make).
struct LinearCall {
  bool dgrad = false, wgrad = false, bgrad = false;
  int64_t m = 0, k = 0, n = 0;  // tokens, in_features, out_features
  bool non_tn = false;          // the device runs non-TN FP8 GEMMs
  // The recipe's forward_fast_accumulation, per call: recipes that share
  // one scaling state may differ in it.
  bool fast_accumulation = false;
  // y's dtype: the input's, which a float32 weight (master weights under
  // torch.autocast, cast straight to FP8) need not share; for an input
  // already cast, the caller's (default: the weight's).
  at::ScalarType out_dtype = at::kFloat;
  fp8kit_linear_plan plan{};
  // Where an inspected call writes its casts' statistics (see
  // LinearStatistics below); undefined for every other call.
  at::Tensor statistics;
};

// An inspected call's cast statistics (fp8kit.torch.inspect): a float32
// [kSlots, kStatColumns] tensor on the layer's device that the forward
// (input, weight) and its backward (grad_output) fill beside their casts,
// a row per slot: the fp8kit_cast_statistics of the slot's high-precision
// tensor and the FP8 copy the cast wrote (read as it is, not re-quantized),
// the scale_inv the cast used, and 1 in kStatRecorded once written (a row
// left 0 had no cast: no backward, or a weight already in FP8). The two
// counts are the core's 32-bit unsigned integers, stored in their float32
// columns' bits.
enum LinearStatistics {
  kStatAmax, kStatUnderflow, kStatSaturated, kStatErrorSq, kStatNormSq, kStatScaleInv,
  kStatRecorded, kStatColumns
};

// Checks `statistics` (when defined) against the layer's device; errors
// name `fn`.
void check_statistics(const char* fn, const at::Tensor& statistics, const at::Device& device);

// Writes row `slot` of `statistics`: the cast of contiguous `x` into
// `data` (its rowwise copy, or with from_columnwise its columnwise one) in
// format `fp8`, with scales `scales`: per tensor its scale_inv (float32
// [1]), which the row keeps; block-scaled (`mode`) that copy's block
// scales, and NaN in the row's scale_inv (no one scale).
void record_statistics(const at::Tensor& statistics, int slot, const at::Tensor& x,
                       fp8kit_dtype fp8, const at::Tensor& data, bool from_columnwise,
                       const at::Tensor& scales,
                       fp8kit_scaling_mode mode = FP8KIT_SCALING_PER_TENSOR);

// The core's plan for `call`'s sizes, gradients and device (the weight is
// torch's [out_features, in_features]).
fp8kit_linear_plan linear_plan(const LinearCall& call);

// Checks one call's tensors against each other and the layer's state (each
// error names `fn`) and returns what the call computes: the gradients asked
// for, its sizes and the core's plan. b may be undefined (no bias).
// x_cast: x is the input's rowwise FP8 copy [M, K], already cast (a fused
// kernel's), in the recipe's forward format; cast_out_dtype then names y's
// dtype (none: the weight's). A high-precision x shares the weight's dtype,
// or, where master_weight allows it, is bf16 / fp16 beside a float32 weight
// (the weight cast to FP8 as it is): y then has x's dtype.
LinearCall linear_call(const char* fn, const LinearState& st, const at::Tensor& x,
                       const at::Tensor& w, const at::Tensor& b, bool dgrad, bool wgrad,
                       bool bgrad, bool fast_accumulation, bool x_cast = false,
                       std::optional<at::ScalarType> cast_out_dtype = std::nullopt,
                       bool master_weight = true);

// A weight already in FP8 (the FP8 all-gather of a sharded weight): its
// rowwise [N, K] and columnwise [K, N] copies (either may be undefined when
// the call's plan does not read it) in the recipe's forward format, and its
// scale_inv (float32, one element).
struct FP8Weight {
  at::Tensor data, columnwise_data, scale_inv;
};

// A Python fp8_weight argument, (data, columnwise_data, scale_inv) with
// data or columnwise_data None where absent (TypeError naming `fn`).
FP8Weight read_fp8_weight(pybind11::handle t, const char* fn);

// A GEMM input that a fused kernel (normalization, activation) has already
// cast into the state's slot: the copies the call's plan asks that slot's
// cast for, their scale_inv (float32 [1]), and, for an inspected call
// (LinearCall::statistics), the high-precision values it cast.
struct CastInput {
  at::Tensor data, columnwise_data, scale_inv, values;
};

// What a forward keeps for backward: the FP8 copies its plan names (the
// others undefined or empty) and their scale_inv (float32 [1]).
struct SavedCopies {
  at::Tensor x_q, x_scale_inv, w_q, w_scale_inv;
};

// The copies a forward is about to keep, and how they are allocated.
struct LinearSaved : SavedCopies {
  // Each in a buffer of its own, rather than all four in one (a dispatcher
  // op's outputs must not alias each other).
  bool own_buffers = false;
};

// The forward below autograd for a checked `call`: y, and, when `saved` is
// given, the copies backward reads (and the delayed-scaling amaxes
// recorded); saved == nullptr: a forward that computes no gradient;
// given: a checked weight already in FP8 (check_forward_extras), read
// instead of quantizing w. cast_x: the input already cast (x is then its
// rowwise copy, read for nothing else, and y is [M, N]); nullptr: x is
// quantized here. y has the weight's dtype (checked: the layer's).
at::Tensor linear_forward_below_autograd(LinearState& st, const at::Tensor& x,
                                         const at::Tensor& w, const at::Tensor& b,
                                         const LinearCall& call, LinearSaved* saved,
                                         const FP8Weight* given = nullptr,
                                         const CastInput* cast_x = nullptr);

// A forward's optional inputs, checked (errors name `fn`): `statistics`
// (when defined) attached to *p, and `fp8_weight` (when given) checked
// against the weight `w` stands for and the copies p's plan reads, into
// *given with a scale_inv of its own. Returns given, or nullptr.
const FP8Weight* check_forward_extras(const char* fn, const LinearState& st,
                                      const at::Tensor& w, const at::Tensor& statistics,
                                      const FP8Weight* fp8_weight, LinearCall* p,
                                      FP8Weight* given);

// Everything backward needs besides the saved tensors.
struct BackwardInfo {
  c10::intrusive_ptr<LinearState> st;
  LinearCall call;
  std::vector<int64_t> x_sizes;
  at::ScalarType x_dtype, w_dtype, b_dtype;
};

// The autograd node of one FP8 Linear call: a plain Node (rather than a
// torch::autograd::Function) because it is made on every forward of small
// layers, where Function's generic bookkeeping (input metadata, output
// wrapping, the saved_data map) is a visible share of the call. Its edges
// are (input, weight, bias); the saved FP8 tensors go through SavedVariable,
// so saved-tensor hooks see them and the engine frees them after backward.
struct LinearBackward : public torch::autograd::Node {
  BackwardInfo info;
  torch::autograd::SavedVariable x_q, x_scale_inv, w_q, w_scale_inv;

  std::string name() const override { return "fp8kit::LinearBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  void release_variables() override;
};

// The backward below autograd: (dx, dw, db), each undefined when `call`
// (info.call narrowed to the gradients asked for, with its plan) does not
// compute it; `saved` is (x_q, x_scale_inv, w_q, w_scale_inv). cast_dy: dy
// already cast into the grad_output slot by a fused kernel, in the copies
// call's plan asks for (dy is then not read, and no bias gradient is
// taken: the kernel takes it); nullptr: dy is quantized here.
torch::autograd::variable_list linear_backward_below_autograd(
    const BackwardInfo& info, const LinearCall& call, const torch::autograd::variable_list& saved,
    const at::Tensor& dy, const CastInput* cast_dy = nullptr);

struct LinearGrads {
  at::Tensor dx, dw, db;
};

// The backward of one Linear call from what its forward kept, checked
// (each error names `fn`): input_shape the forward input's shape,
// out_features N, dtype the layer's (dx's and db's, and dw's unless
// weight_dtype names the weight's: a float32 master weight), the gradients
// the forward planned for and those this backward computes. dy [..., N] in
// high precision, or, with cast_dy, dy already cast (bgrad then false).
// statistics: as linear_forward's (grad_output's row), or undefined.
LinearGrads linear_backward_saved(const char* fn, c10::intrusive_ptr<LinearState> st,
                                  const at::Tensor& dy, const CastInput* cast_dy,
                                  const SavedCopies& saved, at::IntArrayRef input_shape,
                                  int64_t out_features, at::ScalarType dtype, bool forward_dgrad,
                                  bool forward_wgrad, bool dgrad, bool wgrad, bool bgrad,
                                  const at::Tensor& statistics,
                                  std::optional<at::ScalarType> weight_dtype = std::nullopt);

// FP8 y = x @ w.T + bias with autograd (FP8 dgrad and wgrad), per `st`,
// with the forward GEMM's fast accumulation when `fast_accumulation`.
// With `fp8_weight`, the GEMMs read it instead of quantizing `w` (which
// then only gives the weight's shape, dtype and autograd edge) and the
// weight's scaling slot records nothing: whoever cast the weight owns it.
// With `statistics` defined, the call and its backward write their casts'
// statistics there (LinearStatistics); the outputs, gradients and scaling
// state are the same bits either way.
at::Tensor linear_forward(LinearState& st, const at::Tensor& x, const at::Tensor& w,
                          const std::optional<at::Tensor>& bias, bool fast_accumulation,
                          const FP8Weight* fp8_weight = nullptr,
                          const at::Tensor& statistics = at::Tensor());

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_LINEAR_AUTOGRAD_H_
