#include "block_quantizer.h"

#include <cmath>
#include <string>

#include "block_ops.h"
#include "descriptors.h"
#include "errors.h"
#include "initialised.h"
#include "py_float8_block_tensor.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

constexpr ClassHint kHint{
    "fp8kit.torch.Float8BlockQuantizer",
    "fp8kit.torch.Float8BlockQuantizer(fp8_dtype='e4m3', scaling_mode='block_1x128', "
    "rowwise=True, columnwise=True, amax_epsilon=0.0, power_2_scale=True)"};

Float8BlockQuantizer& self_of(py::handle self) {
  return initialised<Float8BlockQuantizer>(self, kHint);
}

Float8BlockQuantizer* make(const char* fn, py::handle fp8_dtype, py::handle scaling_mode,
                           py::handle rowwise, py::handle columnwise, py::handle amax_epsilon,
                           py::handle power_2_scale) {
  const auto where = [&](const char* arg) { return c10::str(fn, ": ", arg); };
  Float8BlockQuantizer q{
      parse_fp8_name(read_str(fp8_dtype, where("fp8_dtype")), fn, "fp8_dtype"),
      parse_block_mode(read_str(scaling_mode, where("scaling_mode")), fn, "scaling_mode"),
      read_bool(rowwise, where("rowwise")), read_bool(columnwise, where("columnwise")),
      read_epsilon(amax_epsilon, where("amax_epsilon")),
      read_bool(power_2_scale, where("power_2_scale"))};
  check_quantizer_usage(fn, q.rowwise, q.columnwise);
  return new Float8BlockQuantizer(q);
}

// Quantizes `x` into a new Float8BlockTensor whose quantizer is `self`.
py::object quantize_new(py::handle self, const char* fn, py::handle x_obj) {
  const Float8BlockQuantizer& q = self_of(self);
  const at::Tensor x_in = read_tensor(x_obj, c10::str(fn, ": x"));
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_high_precision(fn, "x", x_in);
  check_rank(fn, "x", x_in);
  device_type_of(x_in, fn, "x");
  const at::Tensor x = x_in.contiguous();
  DeviceScope scope(x.device());
  const BlockBuffers b = alloc_block_buffers(x, q.fp8, q.mode, q.rowwise, q.columnwise);
  quantize_block_into(x, q.fp8, q.mode, b, q.amax_epsilon, q.power_2_scale);
  return make_float8_block_tensor(x.sizes(), x.scalar_type(), x.device(), b, q.fp8, q.mode, self,
                                  /*requires_grad=*/false);
}

// Re-quantizes `src` into the existing buffers of Float8BlockTensor `dst`
// (the in-place path: copy_ and in-place ops).
void update_quantized(const Float8BlockQuantizer& q, py::handle src_obj, py::handle dst) {
  constexpr const char* fn = "fp8kit Float8BlockQuantizer.update_quantized";
  const at::Tensor src_in = read_tensor(src_obj, c10::str(fn, ": src"));
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_high_precision(fn, "src", src_in);
  check_rank(fn, "src", src_in);
  device_type_of(src_in, fn, "src");
  fp8kit_scaling_mode mode;
  const BlockBuffers b = float8_block_parts(dst, fn, "dst", &mode);
  FP8KIT_VALUE_CHECK(mode == q.mode, fn, ": dst is ", block_mode_name(mode),
                     " but the quantizer makes ", block_mode_name(q.mode));
  check_block_buffers(fn, b, src_in.sizes(), q.fp8, q.mode, src_in);
  const at::Tensor src = src_in.contiguous();
  DeviceScope scope(src.device());
  quantize_block_into(src, q.fp8, q.mode, b, q.amax_epsilon, q.power_2_scale);
}

std::string repr(const Float8BlockQuantizer& q) {
  return c10::str("Float8BlockQuantizer(fp8_dtype='", fp8_name(q.fp8), "', scaling_mode='",
                  block_mode_name(q.mode), "', rowwise=", q.rowwise ? "True" : "False",
                  ", columnwise=", q.columnwise ? "True" : "False",
                  ", amax_epsilon=", q.amax_epsilon,
                  ", power_2_scale=", q.power_2_scale ? "True" : "False", ")");
}

}  // namespace

void register_block_quantizer(py::module_& m) {
  py::class_<Float8BlockQuantizer>(
      m, "Float8BlockQuantizer",
      "Block-scaled quantizer: q(x) returns a Float8BlockTensor with one float32 scale per "
      "1x128 tile ('block_1x128') or 128x128 block ('block_128x128') of each stored copy, "
      "scale = fp8_max / max(amax(block), amax_epsilon) (rounded down to a power of two when "
      "power_2_scale; 1 for a block of zeros or one holding a NaN or inf).")
      .def(py::init([](py::handle fp8_dtype, py::handle scaling_mode, py::handle rowwise,
                       py::handle columnwise, py::handle amax_epsilon, py::handle power_2_scale) {
             return make("fp8kit.torch.Float8BlockQuantizer", fp8_dtype, scaling_mode, rowwise,
                         columnwise, amax_epsilon, power_2_scale);
           }),
           py::arg("fp8_dtype") = "e4m3", py::arg("scaling_mode") = "block_1x128",
           py::arg("rowwise") = true, py::arg("columnwise") = true,
           py::arg("amax_epsilon") = 0.0, py::arg("power_2_scale") = true)
      .def(
          "__call__",
          [](py::handle self, py::handle x) {
            return quantize_new(self, "fp8kit Float8BlockQuantizer.__call__", x);
          },
          py::arg("x"))
      .def(
          "quantize",
          [](py::handle self, py::handle x) {
            return quantize_new(self, "fp8kit Float8BlockQuantizer.quantize", x);
          },
          py::arg("x"), "Same as calling the quantizer.")
      .def(
          "update_quantized",
          [](py::handle self, py::handle src, py::handle dst) {
            update_quantized(self_of(self), src, dst);
            return py::reinterpret_borrow<py::object>(dst);
          },
          py::arg("src"), py::arg("dst"),
          "Re-quantizes src into the existing buffers of Float8BlockTensor dst; returns dst.")
      .def(
          "set_usage",
          [](py::handle self, std::optional<bool> rowwise, std::optional<bool> columnwise) {
            Float8BlockQuantizer& q = self_of(self);
            const bool r = rowwise.value_or(q.rowwise), c = columnwise.value_or(q.columnwise);
            check_quantizer_usage("fp8kit Float8BlockQuantizer.set_usage", r, c);
            q.rowwise = r;
            q.columnwise = c;
          },
          py::arg("rowwise") = py::none(), py::arg("columnwise") = py::none())
      .def_property_readonly("fp8_dtype",
                             [](py::handle self) { return fp8_name(self_of(self).fp8); })
      .def_property_readonly("scaling_mode",
                             [](py::handle self) { return block_mode_name(self_of(self).mode); })
      .def_property_readonly("rowwise", [](py::handle self) { return self_of(self).rowwise; })
      .def_property_readonly("columnwise",
                             [](py::handle self) { return self_of(self).columnwise; })
      .def_property_readonly("amax_epsilon",
                             [](py::handle self) { return self_of(self).amax_epsilon; })
      .def_property_readonly("power_2_scale",
                             [](py::handle self) { return self_of(self).power_2_scale; })
      .def("copy", [](py::handle self) { return new Float8BlockQuantizer(self_of(self)); })
      .def(
          "to",
          [](py::handle self, py::handle device) {
            read_device(device, "fp8kit Float8BlockQuantizer.to: device");
            return new Float8BlockQuantizer(self_of(self));
          },
          py::arg("device"), "A copy (block scaling keeps no device state).")
      .def(
          "__deepcopy__",
          [](py::handle self, py::handle) { return new Float8BlockQuantizer(self_of(self)); },
          py::arg("memo"))
      .def("__repr__", [](py::handle self) { return repr(self_of(self)); })
      .def(py::pickle(
          [](py::handle self) {
            const Float8BlockQuantizer& q = self_of(self);
            return py::make_tuple(std::string(fp8_name(q.fp8)),
                                  std::string(block_mode_name(q.mode)), q.rowwise, q.columnwise,
                                  q.amax_epsilon, q.power_2_scale);
          },
          [](const py::tuple& s) {
            constexpr const char* fn = "fp8kit.torch.Float8BlockQuantizer.__setstate__";
            FP8KIT_VALUE_CHECK(s.size() == 6, fn, ": the pickled state has ", s.size(),
                               " entries; a Float8BlockQuantizer pickles 6 (fp8_dtype, "
                               "scaling_mode, rowwise, columnwise, amax_epsilon, power_2_scale)");
            return make(fn, s[0], s[1], s[2], s[3], s[4], s[5]);
          }));
}

}  // namespace fp8kit_torch
