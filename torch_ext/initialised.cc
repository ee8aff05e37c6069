#include "initialised.h"

#include "errors.h"

namespace py = pybind11;

namespace fp8kit_torch {

bool is_instance_of(py::handle self, const std::type_info& type) {
  const py::detail::type_info* ti = py::detail::get_type_info(type);
  return ti != nullptr && PyObject_TypeCheck(self.ptr(), ti->type);
}

void check_initialised(py::handle self, const std::type_info& type, const ClassHint& hint) {
  // An unbound method (Float8Quantizer.copy(obj)) can be called with any object.
  FP8KIT_TYPE_CHECK(is_instance_of(self, type), "a method of ", hint.name,
                    " was called on a ", Py_TYPE(self.ptr())->tp_name, " object; call it on a ",
                    hint.name);
  // pybind11's own test of a finished __init__ (the one its metaclass runs
  // after Class(...)): every C++ part of the instance holds its object.
  auto* inst = reinterpret_cast<py::detail::instance*>(self.ptr());
  for (const auto& vh : py::detail::values_and_holders(inst)) {
    FP8KIT_TYPE_CHECK(vh.holder_constructed(), hint.name,
                      " object was not initialised (its __init__ was skipped or raised): "
                      "construct it with ", hint.construct);
  }
}

}  // namespace fp8kit_torch
