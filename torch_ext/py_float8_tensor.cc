#include "py_float8_tensor.h"

#include "errors.h"
#include "py_wrapper.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

struct PyRefs {
  py::object cls;  // fp8kit.torch.float8_tensor.Float8Tensor
  // Interned attribute names: Float8Tensor._FIELDS.
  py::object data, columnwise_data, scale_inv, fp8_dtype, quantizer;
  py::object e4m3, e5m2;
};

const PyRefs& refs() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<PyRefs> storage;
  return storage
      .call_once_and_store_result([] {
        PyRefs r;
        r.cls = py::module_::import("fp8kit.torch.float8_tensor").attr("Float8Tensor");
        r.data = interned("_data");
        r.columnwise_data = interned("_columnwise_data");
        r.scale_inv = interned("_scale_inv");
        r.fp8_dtype = interned("_fp8_dtype");
        r.quantizer = interned("_quantizer");
        r.e4m3 = interned("e4m3");
        r.e5m2 = interned("e5m2");
        // The C++ and Python creation paths must set the same fields.
        const py::tuple fields = r.cls.attr("_FIELDS");
        const py::tuple mine = py::make_tuple(r.data, r.columnwise_data, r.scale_inv, r.fp8_dtype,
                                              r.quantizer);
        if (!fields.equal(mine)) {
          throw std::runtime_error(
              "fp8kit: Float8Tensor._FIELDS differs from the names torch_ext sets; update "
              "torch_ext/py_float8_tensor.cc");
        }
        return r;
      })
      .get_stored();
}

}  // namespace

py::object make_float8_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                              const at::Device& device, const at::Tensor& data,
                              const at::Tensor& columnwise_data, const at::Tensor& scale_inv,
                              fp8kit_dtype fp8, py::handle quantizer, bool requires_grad) {
  const PyRefs& r = refs();
  py::object obj = new_quantized_tensor(r.cls, shape, dtype, device, requires_grad);
  set_attr(obj, r.data, wrap_tensor(data));
  set_attr(obj, r.columnwise_data, wrap_tensor(columnwise_data));
  set_attr(obj, r.scale_inv, wrap_tensor(scale_inv));
  set_attr(obj, r.fp8_dtype, fp8 == FP8KIT_E5M2 ? r.e5m2 : r.e4m3);
  set_attr(obj, r.quantizer, quantizer ? quantizer : py::none());
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
