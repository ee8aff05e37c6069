// What every C++ builder of an fp8kit QuantizedTensor (a torch.Tensor
// wrapper subclass defined in Python) shares: the wrapper object with its
// cached properties set, and checked attribute access.
//
// The Python helpers (torch.Tensor._make_wrapper_subclass, torch.Size, the
// attribute names) are looked up once, thread-safely (pybind11's
// gil_safe_call_once_and_store); every Python C-API call is checked and
// references are owned by py::object, so none leak on any path. The cached
// properties' names must match QuantizedTensor._CACHED in
// fp8kit/torch/quantized_tensor.py (checked on first use).
#ifndef FP8KIT_TORCH_EXT_PY_WRAPPER_H_
#define FP8KIT_TORCH_EXT_PY_WRAPPER_H_

#include "torch_includes.h"

namespace fp8kit_torch {

// An interned Python str (an attribute name).
pybind11::object interned(const char* s);

// A new instance of the QuantizedTensor subclass `cls` of logical `shape`,
// nominal `dtype` and `device`, with QuantizedTensor's cached properties
// (dtype, shape, device, is_cuda, requires_grad) set; the caller sets the
// subclass's own fields.
pybind11::object new_quantized_tensor(const pybind11::object& cls, at::IntArrayRef shape,
                                      at::ScalarType dtype, const at::Device& device,
                                      bool requires_grad);

// The tensor as a Python object; None when undefined.
pybind11::object wrap_tensor(const at::Tensor& t);

void set_attr(const pybind11::object& obj, const pybind11::object& name, pybind11::handle value);

// obj.<name> as a tensor (undefined when None; TypeError naming `arg` when
// it is something else).
at::Tensor tensor_attr(pybind11::handle obj, const pybind11::object& name, const char* fn,
                       const char* arg);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_PY_WRAPPER_H_
