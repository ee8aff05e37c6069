// Builds fp8kit.torch.float8_tensor.Float8Tensor objects from C++ (the
// wrapper and its cached properties: py_wrapper.h). The attribute names must
// match Float8Tensor._FIELDS in fp8kit/torch (a test compares the two
// paths).
#ifndef FP8KIT_TORCH_EXT_PY_FLOAT8_TENSOR_H_
#define FP8KIT_TORCH_EXT_PY_FLOAT8_TENSOR_H_

#include "torch_includes.h"

namespace fp8kit_torch {

// A Float8Tensor of logical `shape` and nominal (high-precision) `dtype` on
// `device`, holding rowwise `data` and/or `columnwise_data` (undefined when
// absent), its `scale_inv` and its quantizer (None allowed).
pybind11::object make_float8_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                                    const at::Device& device, const at::Tensor& data,
                                    const at::Tensor& columnwise_data,
                                    const at::Tensor& scale_inv,
                                    fp8kit_dtype fp8, pybind11::handle quantizer,
                                    bool requires_grad);

// The FP8 buffers of a Float8Tensor object (undefined when None).
struct Float8Parts {
  at::Tensor data, columnwise_data, scale_inv;
};
Float8Parts float8_parts(pybind11::handle float8_tensor, const char* fn, const char* arg);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_PY_FLOAT8_TENSOR_H_
