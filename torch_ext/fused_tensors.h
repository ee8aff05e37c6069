// Argument checks of the fused-op bindings (normalization.cc,
// activation.cc, fused_layer_ops.cc): each names the function, the
// argument and the fix, before a descriptor is made.
#ifndef FP8KIT_TORCH_EXT_FUSED_TENSORS_H_
#define FP8KIT_TORCH_EXT_FUSED_TENSORS_H_

#include <cstdint>
#include <optional>

#include "linear_state.h"
#include "torch_includes.h"

namespace fp8kit_torch {

// A fused op's main input: float32 / bfloat16 / float16, rank 1..8, on a
// CPU or CUDA device (the state's, when given), returned contiguous, with
// 16-byte aligned data (the kernels' vectors).
at::Tensor fused_input(const char* fn, const char* arg, const at::Tensor& t);
at::Tensor fused_input(const char* fn, const char* arg, const at::Tensor& t,
                       const LinearState& st);

// A tensor of `ref`'s dtype, shape and device (a gradient), returned
// contiguous and 16-byte aligned. `shape` overrides ref's shape.
at::Tensor fused_like(const char* fn, const char* arg, const at::Tensor& t, const at::Tensor& ref,
                      const char* ref_arg);
at::Tensor fused_like(const char* fn, const char* arg, const at::Tensor& t, const at::Tensor& ref,
                      const char* ref_arg, at::IntArrayRef shape);

// A norm parameter: x's dtype and device, [hidden], contiguous, aligned.
void check_param(const char* fn, const char* arg, const at::Tensor& p, const at::Tensor& x,
                 int64_t hidden);

// mean / rsigma: float32 [rows] on x's device; returned contiguous.
at::Tensor row_stats(const char* fn, const char* arg, const at::Tensor& t, const at::Tensor& x,
                     int64_t rows);

// The dtype of a cast's column sums (the bias gradient), None for none:
// a torch.dtype or None.
std::optional<at::ScalarType> read_sums_dtype(const char* fn, pybind11::handle sums_dtype);
// Checks that dtype (when given) is a high-precision dtype and that the
// cast can produce the sums: the columnwise copy of `input`, [rows, cols]
// with rows > 1 and cols > 1.
void check_sums_dtype(const char* fn, std::optional<at::ScalarType> sums_dtype, bool columnwise,
                      int64_t rows, int64_t cols, const char* input);

// A torch.dtype among float32, bfloat16 and float16 (TypeError naming
// `fn` and `arg`).
at::ScalarType read_high_precision_dtype(pybind11::handle dtype, const char* fn, const char* arg);

// An undefined tensor as None.
pybind11::object optional_tensor(const at::Tensor& t);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_FUSED_TENSORS_H_
