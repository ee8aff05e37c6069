// What every C++ builder of an fp8kit QuantizedTensor (a torch.Tensor
// wrapper subclass defined in Python) shares: the wrapper object with its
// cached properties and its subclass's fields set, and checked access to
// those fields.
//
// The Python helpers (torch.Tensor._make_wrapper_subclass, torch.Size, the
// attribute names) are looked up once, thread-safely (pybind11's
// gil_safe_call_once_and_store); every Python C-API call is checked and
// references are owned by py::object, so none leak on any path. The cached
// properties' names must match QuantizedTensor._CACHED in
// fp8kit/torch/quantized_tensor.py, and each subclass's field names its
// _FIELDS (both checked on first use).
#ifndef FP8KIT_TORCH_EXT_PY_WRAPPER_H_
#define FP8KIT_TORCH_EXT_PY_WRAPPER_H_

#include <initializer_list>
#include <string>
#include <vector>

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

// The interned str fp8kit's quantized tensors hold as _fp8_dtype: "e4m3" /
// "e5m2".
pybind11::handle fp8_name_str(fp8kit_dtype f);

// One QuantizedTensor subclass as its C++ builder sees it: the class and
// the interned names of its fields, in the order of its _FIELDS. A builder
// keeps one, made on first use, and indexes its fields with an enum of the
// same order.
class WrapperClass {
 public:
  // Imports module.class_name and interns `fields`; RuntimeError when they
  // differ from the class's _FIELDS (naming `builder`, the file to update).
  WrapperClass(const char* module, const char* class_name,
               std::initializer_list<const char*> fields, const char* builder);

  // A new instance (new_quantized_tensor) with field i set to values[i]
  // (one value per field).
  pybind11::object make(at::IntArrayRef shape, at::ScalarType dtype, const at::Device& device,
                        bool requires_grad, std::initializer_list<pybind11::handle> values) const;

  // TypeError naming `arg` unless t is an instance of the class.
  void check_instance(pybind11::handle t, const char* fn, const char* arg) const;

  // The interned name of field i.
  const pybind11::object& field(size_t i) const { return fields_[i]; }

 private:
  pybind11::object cls_;
  std::string class_name_;
  std::vector<pybind11::object> fields_;
};

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_PY_WRAPPER_H_
