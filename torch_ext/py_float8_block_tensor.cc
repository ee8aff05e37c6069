#include "py_float8_block_tensor.h"

#include <string>

#include "errors.h"
#include "py_wrapper.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

struct PyRefs {
  py::object cls;  // fp8kit.torch.float8_block_tensor.Float8BlockTensor
  // Interned attribute names: Float8BlockTensor._FIELDS.
  py::object data, block_scale_inv, columnwise_data, columnwise_block_scale_inv, fp8_dtype,
      scaling_mode, quantizer;
  py::object e4m3, e5m2, block_1x128, block_128x128;
};

const PyRefs& refs() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<PyRefs> storage;
  return storage
      .call_once_and_store_result([] {
        PyRefs r;
        r.cls = py::module_::import("fp8kit.torch.float8_block_tensor").attr("Float8BlockTensor");
        r.data = interned("_data");
        r.block_scale_inv = interned("_block_scale_inv");
        r.columnwise_data = interned("_columnwise_data");
        r.columnwise_block_scale_inv = interned("_columnwise_block_scale_inv");
        r.fp8_dtype = interned("_fp8_dtype");
        r.scaling_mode = interned("_scaling_mode");
        r.quantizer = interned("_quantizer");
        r.e4m3 = interned("e4m3");
        r.e5m2 = interned("e5m2");
        r.block_1x128 = interned(block_mode_name(FP8KIT_SCALING_BLOCK_1X128));
        r.block_128x128 = interned(block_mode_name(FP8KIT_SCALING_BLOCK_128X128));
        const py::tuple fields = r.cls.attr("_FIELDS");
        const py::tuple mine =
            py::make_tuple(r.data, r.block_scale_inv, r.columnwise_data,
                           r.columnwise_block_scale_inv, r.fp8_dtype, r.scaling_mode, r.quantizer);
        if (!fields.equal(mine)) {
          throw std::runtime_error(
              "fp8kit: Float8BlockTensor._FIELDS differs from the names torch_ext sets; update "
              "torch_ext/py_float8_block_tensor.cc");
        }
        return r;
      })
      .get_stored();
}

}  // namespace

py::object make_float8_block_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                                    const at::Device& device, const BlockBuffers& b,
                                    fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                                    py::handle quantizer, bool requires_grad) {
  const PyRefs& r = refs();
  py::object obj = new_quantized_tensor(r.cls, shape, dtype, device, requires_grad);
  set_attr(obj, r.data, wrap_tensor(b.data));
  set_attr(obj, r.block_scale_inv, wrap_tensor(b.block_scale_inv));
  set_attr(obj, r.columnwise_data, wrap_tensor(b.columnwise_data));
  set_attr(obj, r.columnwise_block_scale_inv, wrap_tensor(b.columnwise_block_scale_inv));
  set_attr(obj, r.fp8_dtype, fp8 == FP8KIT_E5M2 ? r.e5m2 : r.e4m3);
  set_attr(obj, r.scaling_mode,
           mode == FP8KIT_SCALING_BLOCK_128X128 ? r.block_128x128 : r.block_1x128);
  set_attr(obj, r.quantizer, quantizer ? quantizer : py::none());
  return obj;
}

BlockBuffers float8_block_parts(py::handle t, const char* fn, const char* arg,
                                fp8kit_scaling_mode* mode) {
  const PyRefs& r = refs();
  const int is = PyObject_IsInstance(t.ptr(), r.cls.ptr());
  if (is < 0) throw py::error_already_set();
  FP8KIT_TYPE_CHECK(is == 1, fn, ": ", arg, " is a ", Py_TYPE(t.ptr())->tp_name,
                    "; expected an fp8kit Float8BlockTensor");
  BlockBuffers b;
  b.data = tensor_attr(t, r.data, fn, arg);
  b.block_scale_inv = tensor_attr(t, r.block_scale_inv, fn, arg);
  b.columnwise_data = tensor_attr(t, r.columnwise_data, fn, arg);
  b.columnwise_block_scale_inv = tensor_attr(t, r.columnwise_block_scale_inv, fn, arg);
  PyObject* m = PyObject_GetAttr(t.ptr(), r.scaling_mode.ptr());
  if (m == nullptr) throw py::error_already_set();
  const py::object mode_obj = py::reinterpret_steal<py::object>(m);
  FP8KIT_TYPE_CHECK(PyUnicode_Check(mode_obj.ptr()), fn, ": ", arg,
                    "._scaling_mode is not a str");
  const std::string where = c10::str(arg, "._scaling_mode");
  *mode = parse_block_mode(mode_obj.cast<std::string>(), fn, where.c_str());
  return b;
}

}  // namespace fp8kit_torch
