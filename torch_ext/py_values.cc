#include "py_values.h"

#include <cmath>

#include "errors.h"

namespace py = pybind11;

namespace fp8kit_torch {

std::string value_str(py::handle v) {
  return c10::str(py::repr(v).cast<std::string>(), " (", Py_TYPE(v.ptr())->tp_name, ")");
}

int read_int(py::handle v, const std::string& where, int lo, int hi) {
  FP8KIT_TYPE_CHECK(PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()), where, " is ", value_str(v),
                    "; it must be an int in [", lo, ", ", hi, "]");
  // Overflow-safe: a huge int is out of range, not a C++ cast error.
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  FP8KIT_VALUE_CHECK(overflow == 0 && x >= lo && x <= hi, where, " is ",
                     py::str(v).cast<std::string>(), "; it must be in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

bool read_bool(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(PyBool_Check(v.ptr()), where, " is ", value_str(v), "; it must be a bool");
  return v.ptr() == Py_True;
}

double read_epsilon(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(PyFloat_Check(v.ptr()) || (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())),
                    where, " is ", value_str(v), "; it must be a float >= 0");
  const double x = PyFloat_AsDouble(v.ptr());
  if (x == -1.0 && PyErr_Occurred()) throw py::error_already_set();  // an int too big
  FP8KIT_VALUE_CHECK(std::isfinite(x) && x >= 0.0, where, " is ", x,
                     "; it must be a finite float >= 0 (0 disables it)");
  return x;
}

std::string read_str(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(PyUnicode_Check(v.ptr()), where, " is ", value_str(v), "; it must be a str");
  return v.cast<std::string>();
}

at::Tensor read_tensor(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(THPVariable_Check(v.ptr()), where, " is ", value_str(v),
                    "; it must be a torch.Tensor");
  return THPVariable_Unpack(v.ptr());
}

at::Device read_device(py::handle v, const std::string& where) {
  if (THPDevice_Check(v.ptr())) return reinterpret_cast<THPDevice*>(v.ptr())->device;
  FP8KIT_TYPE_CHECK(PyUnicode_Check(v.ptr()), where, " is ", value_str(v),
                    "; it must be a torch.device or a device string such as 'cpu' or 'cuda:0'");
  const std::string s = v.cast<std::string>();
  try {
    return at::Device(s);
  } catch (const c10::Error&) {
    C10_THROW_ERROR(ValueError, c10::str(where, " is '", s, "'; it must name a device such as "
                                         "'cpu' or 'cuda:0'"));
  }
}

}  // namespace fp8kit_torch
