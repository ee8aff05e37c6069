// fp8kit's functional ops on torch tensors, one per C API op. Two glues call
// them: the pybind11 functions of fp8kit._torch_ext (register_ops; wrapped by
// fp8kit.torch.ops) and the dispatcher ops torch.ops.fp8kit.*
// (dispatcher_ops.cc). `fn` is the name error messages give the caller.
#ifndef FP8KIT_TORCH_EXT_OPS_H_
#define FP8KIT_TORCH_EXT_OPS_H_

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "torch_includes.h"

namespace fp8kit_torch {

using OptTensor = std::optional<at::Tensor>;

// max |x| as a float32 0-d tensor on x's device.
at::Tensor amax(const char* fn, const at::Tensor& x);

// The columnwise copy of FP8 `data` (any shape, made contiguous): its 2-D
// view [prod(leading dims), last dim] transposed, exactly.
at::Tensor columnwise_from_rowwise(const char* fn, const at::Tensor& data);

// Quantizes x with the given float32[1] scale: (data or nullopt,
// columnwise_data or nullopt, scale_inv[1]); amax_out, when given,
// receives max |x|.
std::tuple<OptTensor, OptTensor, at::Tensor> quantize(const char* fn, const at::Tensor& x,
                                                      const at::Tensor& scale, fp8kit_dtype f,
                                                      bool rowwise, bool columnwise,
                                                      const OptTensor& amax_out);

// Current scaling: (data or nullopt, columnwise_data or nullopt, scale[1],
// scale_inv[1], amax[1]).
std::tuple<OptTensor, OptTensor, at::Tensor, at::Tensor, at::Tensor> quantize_current_scaling(
    const char* fn, const at::Tensor& x, fp8kit_dtype f, bool rowwise, bool columnwise,
    double amax_epsilon, bool power_2_scale);

// data * scale_inv in out_dtype; from_columnwise reads the [last,
// prod(leading)] copy and returns `shape` (default: the 2-D transpose).
at::Tensor dequantize(const char* fn, const at::Tensor& data, const at::Tensor& scale_inv,
                      at::ScalarType out_dtype, bool from_columnwise,
                      const std::optional<std::vector<int64_t>>& shape);

// Rolls each amax history and recomputes scale and scale_inv, in place.
void delayed_scaling_update(const char* fn, const std::vector<at::Tensor>& histories,
                            const std::vector<at::Tensor>& amaxes,
                            const std::vector<at::Tensor>& scales,
                            const std::vector<at::Tensor>& scale_invs,
                            const std::vector<std::string>& fp8_dtypes, int64_t margin,
                            const std::string& amax_reduction);

// D = (op(a) * a_scale_inv) @ (op(b) * b_scale_inv) (+ bias) (GELU) into a
// new [m, n] tensor or into `out`; each operand is its rowwise data, its
// columnwise copy, or both.
at::Tensor gemm(const char* fn, const OptTensor& a, const at::Tensor& a_scale_inv,
                const OptTensor& a_columnwise, const OptTensor& b, const at::Tensor& b_scale_inv,
                const OptTensor& b_columnwise, bool trans_a, bool trans_b,
                at::ScalarType out_dtype, const OptTensor& bias, bool gelu,
                const OptTensor& gelu_aux, bool accumulate, bool use_split_accumulator,
                const OptTensor& d_scale, const OptTensor& d_amax, const OptTensor& out);

// Binds the ops above (and the core's constants) into fp8kit._torch_ext.
void register_ops(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_OPS_H_
