#include "py_float8_tensor.h"

#include "errors.h"
#include "py_wrapper.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

// Float8Tensor._FIELDS, in its order.
struct Float8Field {
  enum : size_t { kData, kColumnwiseData, kScaleInv, kFp8Dtype, kQuantizer };
};

const WrapperClass& float8_tensor_class() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<WrapperClass> storage;
  return storage
      .call_once_and_store_result([] {
        return WrapperClass("fp8kit.torch.float8_tensor", "Float8Tensor",
                            {"_data", "_columnwise_data", "_scale_inv", "_fp8_dtype", "_quantizer"},
                            "torch_ext/py_float8_tensor.cc");
      })
      .get_stored();
}

}  // namespace

py::object make_float8_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                              const at::Device& device, const at::Tensor& data,
                              const at::Tensor& columnwise_data, const at::Tensor& scale_inv,
                              fp8kit_dtype fp8, py::handle quantizer, bool requires_grad) {
  return float8_tensor_class().make(
      shape, dtype, device, requires_grad,
      {wrap_tensor(data), wrap_tensor(columnwise_data), wrap_tensor(scale_inv), fp8_name_str(fp8),
       quantizer ? quantizer : py::none()});
}

Float8Parts float8_parts(py::handle t, const char* fn, const char* arg) {
  const WrapperClass& c = float8_tensor_class();
  c.check_instance(t, fn, arg);
  Float8Parts p;
  p.data = tensor_attr(t, c.field(Float8Field::kData), fn, arg);
  p.columnwise_data = tensor_attr(t, c.field(Float8Field::kColumnwiseData), fn, arg);
  p.scale_inv = tensor_attr(t, c.field(Float8Field::kScaleInv), fn, arg);
  return p;
}

}  // namespace fp8kit_torch
