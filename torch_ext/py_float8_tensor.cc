#include "py_float8_tensor.h"

#include "errors.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

struct PyRefs {
  py::object cls;           // fp8kit.torch.float8_tensor.Float8Tensor
  py::object make_wrapper;  // torch.Tensor._make_wrapper_subclass
  py::object size_type;     // torch.Size
  py::object kwnames;       // ("dtype", "device", "requires_grad")
  // Interned attribute names.
  py::object data, columnwise_data, scale_inv, fp8_dtype, quantizer;  // Float8Tensor._FIELDS
  py::object c_dtype, c_shape, c_device, c_is_cuda, c_requires_grad;  // QuantizedTensor._CACHED
  py::object e4m3, e5m2;
};

py::object interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

const PyRefs& refs() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<PyRefs> storage;
  return storage
      .call_once_and_store_result([] {
        PyRefs r;
        r.cls = py::module_::import("fp8kit.torch.float8_tensor").attr("Float8Tensor");
        py::module_ torch = py::module_::import("torch");
        r.make_wrapper = torch.attr("Tensor").attr("_make_wrapper_subclass");
        r.size_type = torch.attr("Size");
        r.kwnames = py::make_tuple(interned("dtype"), interned("device"),
                                   interned("requires_grad"));
        r.data = interned("_data");
        r.columnwise_data = interned("_columnwise_data");
        r.scale_inv = interned("_scale_inv");
        r.fp8_dtype = interned("_fp8_dtype");
        r.quantizer = interned("_quantizer");
        r.c_dtype = interned("_dtype");
        r.c_shape = interned("_shape");
        r.c_device = interned("_device");
        r.c_is_cuda = interned("_is_cuda");
        r.c_requires_grad = interned("_requires_grad");
        r.e4m3 = interned("e4m3");
        r.e5m2 = interned("e5m2");
        // The C++ and Python creation paths must set the same fields.
        const py::tuple fields = r.cls.attr("_FIELDS");
        const py::tuple cached = r.cls.attr("_CACHED");
        const py::tuple mine = py::make_tuple(r.data, r.columnwise_data, r.scale_inv, r.fp8_dtype,
                                              r.quantizer);
        const py::tuple mine_cached = py::make_tuple(r.c_dtype, r.c_shape, r.c_device,
                                                     r.c_is_cuda, r.c_requires_grad);
        if (!fields.equal(mine) || !cached.equal(mine_cached)) {
          throw std::runtime_error(
              "fp8kit: Float8Tensor._FIELDS/_CACHED differ from the names torch_ext sets; "
              "update torch_ext/py_float8_tensor.cc");
        }
        return r;
      })
      .get_stored();
}

py::object wrap(const at::Tensor& t) {
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

}  // namespace

py::object make_float8_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                              const at::Device& device, const at::Tensor& data,
                              const at::Tensor& columnwise_data, const at::Tensor& scale_inv,
                              fp8kit_dtype fp8, py::handle quantizer, bool requires_grad) {
  const PyRefs& r = refs();
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

  PyObject* args[] = {r.cls.ptr(), size.ptr(), dtype_obj.ptr(), dev.ptr(), rg.ptr()};
  PyObject* res = PyObject_Vectorcall(r.make_wrapper.ptr(), args, 2, r.kwnames.ptr());
  if (res == nullptr) throw py::error_already_set();
  py::object obj = py::reinterpret_steal<py::object>(res);

  set_attr(obj, r.data, wrap(data));
  set_attr(obj, r.columnwise_data, wrap(columnwise_data));
  set_attr(obj, r.scale_inv, wrap(scale_inv));
  set_attr(obj, r.fp8_dtype, fp8 == FP8KIT_E5M2 ? r.e5m2 : r.e4m3);
  set_attr(obj, r.quantizer, quantizer ? quantizer : py::none());
  set_attr(obj, r.c_dtype, dtype_obj);
  set_attr(obj, r.c_shape, size);
  set_attr(obj, r.c_device, dev);
  set_attr(obj, r.c_is_cuda, device.is_cuda() ? Py_True : Py_False);
  set_attr(obj, r.c_requires_grad, rg);
  return obj;
}

Float8Parts float8_parts(py::handle t, const char* fn, const char* arg) {
  const PyRefs& r = refs();
  const int is = PyObject_IsInstance(t.ptr(), r.cls.ptr());
  if (is < 0) throw py::error_already_set();
  FP8KIT_TYPE_CHECK(is == 1, fn, ": ", arg, " is a ", Py_TYPE(t.ptr())->tp_name,
                    "; expected an fp8kit Float8Tensor");
  Float8Parts p;
  p.data = tensor_attr(t, r.data, fn, arg);
  p.columnwise_data = tensor_attr(t, r.columnwise_data, fn, arg);
  p.scale_inv = tensor_attr(t, r.scale_inv, fn, arg);
  return p;
}

}  // namespace fp8kit_torch
