#include "py_float8_block_tensor.h"

#include <string>

#include "errors.h"
#include "py_wrapper.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

// Float8BlockTensor._FIELDS, in its order.
struct BlockField {
  enum : size_t {
    kData,
    kBlockScaleInv,
    kColumnwiseData,
    kColumnwiseBlockScaleInv,
    kFp8Dtype,
    kScalingMode,
    kQuantizer
  };
};

struct BlockTensorRefs {
  WrapperClass cls;
  py::object block_1x128, block_128x128;  // the values of _scaling_mode
};

const BlockTensorRefs& block_tensor_refs() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<BlockTensorRefs> storage;
  return storage
      .call_once_and_store_result([] {
        return BlockTensorRefs{
            WrapperClass("fp8kit.torch.float8_block_tensor", "Float8BlockTensor",
                         {"_data", "_block_scale_inv", "_columnwise_data",
                          "_columnwise_block_scale_inv", "_fp8_dtype", "_scaling_mode",
                          "_quantizer"},
                         "torch_ext/py_float8_block_tensor.cc"),
            interned(block_mode_name(FP8KIT_SCALING_BLOCK_1X128)),
            interned(block_mode_name(FP8KIT_SCALING_BLOCK_128X128))};
      })
      .get_stored();
}

}  // namespace

py::object make_float8_block_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                                    const at::Device& device, const BlockBuffers& b,
                                    fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                                    py::handle quantizer, bool requires_grad) {
  const BlockTensorRefs& r = block_tensor_refs();
  return r.cls.make(shape, dtype, device, requires_grad,
                    {wrap_tensor(b.data), wrap_tensor(b.block_scale_inv),
                     wrap_tensor(b.columnwise_data), wrap_tensor(b.columnwise_block_scale_inv),
                     fp8_name_str(fp8),
                     mode == FP8KIT_SCALING_BLOCK_128X128 ? r.block_128x128 : r.block_1x128,
                     quantizer ? quantizer : py::none()});
}

BlockBuffers float8_block_parts(py::handle t, const char* fn, const char* arg,
                                fp8kit_scaling_mode* mode) {
  const WrapperClass& c = block_tensor_refs().cls;
  c.check_instance(t, fn, arg);
  BlockBuffers b;
  b.data = tensor_attr(t, c.field(BlockField::kData), fn, arg);
  b.block_scale_inv = tensor_attr(t, c.field(BlockField::kBlockScaleInv), fn, arg);
  b.columnwise_data = tensor_attr(t, c.field(BlockField::kColumnwiseData), fn, arg);
  b.columnwise_block_scale_inv =
      tensor_attr(t, c.field(BlockField::kColumnwiseBlockScaleInv), fn, arg);
  PyObject* m = PyObject_GetAttr(t.ptr(), c.field(BlockField::kScalingMode).ptr());
  if (m == nullptr) throw py::error_already_set();
  const py::object mode_obj = py::reinterpret_steal<py::object>(m);
  FP8KIT_TYPE_CHECK(PyUnicode_Check(mode_obj.ptr()), fn, ": ", arg,
                    "._scaling_mode is not a str");
  const std::string where = c10::str(arg, "._scaling_mode");
  *mode = parse_block_mode(mode_obj.cast<std::string>(), fn, where.c_str());
  return b;
}

}  // namespace fp8kit_torch
