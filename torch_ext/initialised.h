// The C++ object behind `self` in the extension's bound methods.
//
// pybind11 hands a method an instance whose __init__ was skipped
// (C.__new__(C)) or raised as freshly allocated, uninitialised memory, so
// using it crashes or reads garbage. Every method of the extension's
// classes therefore takes `self` as a py::handle and reaches the object
// through initialised<T>(), which raises a TypeError saying how to
// construct the object instead.
#ifndef FP8KIT_TORCH_EXT_INITIALISED_H_
#define FP8KIT_TORCH_EXT_INITIALISED_H_

#include <typeinfo>

#include "torch_includes.h"

namespace fp8kit_torch {

// A class's public name and how to construct one, for the error.
struct ClassHint {
  const char* name;       // "fp8kit.torch.Float8Quantizer"
  const char* construct;  // "Float8Quantizer(scale, fp8_dtype='e4m3', amax=None)"
};

// Whether `self` is an instance of the class bound for `type` (or of a
// Python subclass of it).
bool is_instance_of(pybind11::handle self, const std::type_info& type);

// TypeError unless `self` is an instance of the class bound for `type`
// whose C++ object was constructed.
void check_initialised(pybind11::handle self, const std::type_info& type, const ClassHint& hint);

template <typename T>
T& initialised(pybind11::handle self, const ClassHint& hint) {
  check_initialised(self, typeid(T), hint);
  return self.cast<T&>();
}

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_INITIALISED_H_
