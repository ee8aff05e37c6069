#include "py_wrapper.h"

#include "errors.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

struct WrapperRefs {
  py::object make_wrapper;  // torch.Tensor._make_wrapper_subclass
  py::object size_type;     // torch.Size
  py::object kwnames;       // ("dtype", "device", "requires_grad")
  // QuantizedTensor._CACHED, in its order.
  py::object c_dtype, c_shape, c_device, c_is_cuda, c_requires_grad;
  py::object e4m3, e5m2;  // the values of _fp8_dtype
};

const WrapperRefs& wrapper_refs() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<WrapperRefs> storage;
  return storage
      .call_once_and_store_result([] {
        WrapperRefs r;
        py::module_ torch = py::module_::import("torch");
        r.make_wrapper = torch.attr("Tensor").attr("_make_wrapper_subclass");
        r.size_type = torch.attr("Size");
        r.kwnames = py::make_tuple(interned("dtype"), interned("device"),
                                   interned("requires_grad"));
        r.c_dtype = interned("_dtype");
        r.c_shape = interned("_shape");
        r.c_device = interned("_device");
        r.c_is_cuda = interned("_is_cuda");
        r.c_requires_grad = interned("_requires_grad");
        r.e4m3 = interned("e4m3");
        r.e5m2 = interned("e5m2");
        const py::tuple cached = py::module_::import("fp8kit.torch.quantized_tensor")
                                     .attr("QuantizedTensor")
                                     .attr("_CACHED");
        const py::tuple mine = py::make_tuple(r.c_dtype, r.c_shape, r.c_device, r.c_is_cuda,
                                              r.c_requires_grad);
        if (!cached.equal(mine)) {
          throw std::runtime_error(
              "fp8kit: QuantizedTensor._CACHED differs from the names torch_ext sets; update "
              "torch_ext/py_wrapper.cc");
        }
        return r;
      })
      .get_stored();
}

}  // namespace

py::object interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

py::object new_quantized_tensor(const py::object& cls, at::IntArrayRef shape,
                                at::ScalarType dtype, const at::Device& device,
                                bool requires_grad) {
  const WrapperRefs& r = wrapper_refs();
  py::tuple dims(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    PyObject* d = PyLong_FromLongLong(shape[i]);
    if (d == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(dims.ptr(), i, d);  // steals d
  }
  PyObject* size_raw = PyObject_CallOneArg(r.size_type.ptr(), dims.ptr());
  if (size_raw == nullptr) throw py::error_already_set();
  py::object size = py::reinterpret_steal<py::object>(size_raw);
  py::handle dtype_obj(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));  // borrowed
  PyObject* dev_raw = THPDevice_New(device);
  if (dev_raw == nullptr) throw py::error_already_set();
  py::object dev = py::reinterpret_steal<py::object>(dev_raw);
  py::handle rg = requires_grad ? Py_True : Py_False;

  PyObject* args[] = {cls.ptr(), size.ptr(), dtype_obj.ptr(), dev.ptr(), rg.ptr()};
  PyObject* res = PyObject_Vectorcall(r.make_wrapper.ptr(), args, 2, r.kwnames.ptr());
  if (res == nullptr) throw py::error_already_set();
  py::object obj = py::reinterpret_steal<py::object>(res);
  set_attr(obj, r.c_dtype, dtype_obj);
  set_attr(obj, r.c_shape, size);
  set_attr(obj, r.c_device, dev);
  set_attr(obj, r.c_is_cuda, device.is_cuda() ? Py_True : Py_False);
  set_attr(obj, r.c_requires_grad, rg);
  return obj;
}

py::object wrap_tensor(const at::Tensor& t) {
  if (!t.defined()) return py::none();
  PyObject* o = THPVariable_Wrap(t);
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

void set_attr(const py::object& obj, const py::object& name, py::handle value) {
  if (PyObject_SetAttr(obj.ptr(), name.ptr(), value.ptr()) != 0) throw py::error_already_set();
}

at::Tensor tensor_attr(py::handle obj, const py::object& name, const char* fn, const char* arg) {
  PyObject* o = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (o == nullptr) throw py::error_already_set();
  py::object v = py::reinterpret_steal<py::object>(o);
  if (v.is_none()) return at::Tensor();
  FP8KIT_TYPE_CHECK(THPVariable_Check(v.ptr()), fn, ": ", arg, ".",
                    py::str(name).cast<std::string>(), " is not a tensor");
  return THPVariable_Unpack(v.ptr());
}

py::handle fp8_name_str(fp8kit_dtype f) {
  const WrapperRefs& r = wrapper_refs();
  return f == FP8KIT_E5M2 ? r.e5m2 : r.e4m3;
}

WrapperClass::WrapperClass(const char* module, const char* class_name,
                           std::initializer_list<const char*> fields, const char* builder)
    : cls_(py::module_::import(module).attr(class_name)), class_name_(class_name) {
  for (const char* name : fields) fields_.push_back(interned(name));
  // The C++ and Python creation paths must set the same fields.
  const py::tuple python_fields = cls_.attr("_FIELDS");
  if (!python_fields.equal(py::tuple(py::cast(fields_)))) {
    throw std::runtime_error(c10::str("fp8kit: ", class_name, "._FIELDS differs from the names "
                                      "torch_ext sets; update ", builder));
  }
}

py::object WrapperClass::make(at::IntArrayRef shape, at::ScalarType dtype,
                              const at::Device& device, bool requires_grad,
                              std::initializer_list<py::handle> values) const {
  TORCH_INTERNAL_ASSERT(values.size() == fields_.size(), class_name_, " has ", fields_.size(),
                        " fields but ", values.size(), " values were given");
  py::object obj = new_quantized_tensor(cls_, shape, dtype, device, requires_grad);
  size_t i = 0;
  for (py::handle v : values) set_attr(obj, fields_[i++], v);
  return obj;
}

void WrapperClass::check_instance(py::handle t, const char* fn, const char* arg) const {
  const int is = PyObject_IsInstance(t.ptr(), cls_.ptr());
  if (is < 0) throw py::error_already_set();
  FP8KIT_TYPE_CHECK(is == 1, fn, ": ", arg, " is a ", Py_TYPE(t.ptr())->tp_name,
                    "; expected an fp8kit ", class_name_);
}

}  // namespace fp8kit_torch
