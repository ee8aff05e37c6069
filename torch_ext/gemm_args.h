// What the two GEMM bindings (ops.cc: per-tensor scales, block_ops.cc:
// block scales) check and build alike around their operands: an operand's
// logical 2-D shape, the product's shape, the output D, the config's flags
// and the bias. `fn` is the name error messages give the caller; `ref_arg`
// names `ref`, the operand tensor that D and the bias must share a device
// with.
#ifndef FP8KIT_TORCH_EXT_GEMM_ARGS_H_
#define FP8KIT_TORCH_EXT_GEMM_ARGS_H_

#include <optional>

#include "torch_includes.h"

namespace fp8kit_torch {

// The logical 2-D shape of a GEMM operand: rows x cols of its rowwise
// layout.
struct OperandShape {
  int64_t rows, cols;
};

// An operand's shape from its rowwise data x (rank >= 1, read as
// [prod(leading dims), last dim]) or, without x, from its columnwise data
// x_cw ([cols, rows]); at least one is given, and x_cw, when given, must be
// 2-D. ValueError naming the argument otherwise.
OperandShape gemm_operand_shape(const char* fn, const char* name,
                                const std::optional<at::Tensor>& x, const char* name_cw,
                                const std::optional<at::Tensor>& x_cw);

// D's shape [m, n] for op(a) @ op(b) (a, b: the operands' descriptors, on
// device_a and device_b); ValueError unless both share a device and op(a)'s
// columns are op(b)'s rows.
struct GemmShape {
  int64_t m, n;
};
GemmShape gemm_shape(const char* fn, const fp8kit_tensor& a, const at::Device& device_a,
                     const fp8kit_tensor& b, const at::Device& device_b, bool trans_a,
                     bool trans_b);

// D: `out` checked (dense, out_dtype, [m, n], contiguous, on ref's device),
// or without it a new [m, n] tensor of out_dtype on ref's device (then
// accumulate, which adds into out's old contents, is refused).
at::Tensor gemm_output(const char* fn, const std::optional<at::Tensor>& out,
                       at::ScalarType out_dtype, GemmShape shape, bool accumulate,
                       const char* ref_arg, const at::Tensor& ref);

// The default config with the flags every GEMM binding takes.
fp8kit_gemm_config gemm_config(bool trans_a, bool trans_b, bool accumulate,
                               bool use_split_accumulator);

// Checks bias (dense, its fp8kit `dtype`, [n], on ref's device) and points
// cfg's bias at it. `dtype` is nullopt when the binding does not take the
// bias's torch dtype, and `dtype_fix` then says which to pass. Returns the
// contiguous tensor cfg points into; it must outlive the GEMM call.
at::Tensor set_gemm_bias(const char* fn, const at::Tensor& bias,
                         std::optional<fp8kit_dtype> dtype, const char* dtype_fix, int64_t n,
                         const char* ref_arg, const at::Tensor& ref, fp8kit_gemm_config* cfg);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_GEMM_ARGS_H_
