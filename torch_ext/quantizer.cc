#include "quantizer.h"

#include <string>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "py_float8_tensor.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

void check_usage(const char* fn, bool rowwise, bool columnwise) {
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; a quantizer must produce at least "
                     "one layout");
}

void check_state_scalar(const char* fn, const char* arg, const at::Tensor& t) {
  check_dense(fn, arg, t);
  FP8KIT_TYPE_CHECK(t.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()), "; it must be a torch.float32 tensor of shape [1]");
  FP8KIT_VALUE_CHECK(t.numel() == 1, fn, ": ", arg, " has shape ", shape_str(t.sizes()),
                     "; it must be a torch.float32 tensor of shape [1]");
  check_contiguous(fn, arg, t);
}

// Quantizes `x` with `q` into a new Float8Tensor whose quantizer is `self`.
py::object quantize_new(py::handle self, Quantizer& q, const at::Tensor& x_in, const char* fn) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_high_precision(fn, "x", x_in);
  check_rank(fn, "x", x_in);
  device_type_of(x_in, fn, "x");
  q.check_device(fn, x_in);
  const at::Tensor x = x_in.contiguous();
  DeviceScope scope(x.device());
  const at::Tensor data = q.rowwise ? alloc_rowwise(x, q.fp8) : at::Tensor();
  const at::Tensor columnwise_data = q.columnwise ? alloc_columnwise(x, q.fp8) : at::Tensor();
  at::Tensor scale_inv = at::empty({1}, x.options().dtype(at::kFloat));
  q.quantize_to(x, data, columnwise_data, scale_inv);
  return make_float8_tensor(x.sizes(), x.scalar_type(), x.device(), data, columnwise_data,
                            scale_inv, q.fp8, self, /*requires_grad=*/false);
}

// Re-quantizes `src` into the existing buffers of Float8Tensor `dst` (the
// in-place path: copy_ and in-place ops on a Float8Tensor).
void update_quantized(Quantizer& q, const at::Tensor& src_in, py::handle dst) {
  constexpr const char* fn = "fp8kit Quantizer.update_quantized";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_high_precision(fn, "src", src_in);
  device_type_of(src_in, fn, "src");
  q.check_device(fn, src_in);
  Float8Parts p = float8_parts(dst, fn, "dst");
  const at::Tensor& ref = p.data.defined() ? p.data : p.columnwise_data;
  FP8KIT_VALUE_CHECK(ref.defined(), fn, ": dst holds no FP8 data");
  const fp8kit_dtype f = check_fp8(fn, "dst", ref);
  FP8KIT_TYPE_CHECK(f == q.fp8, fn, ": dst holds ", fp8_name(f), " data but the quantizer makes ",
                    fp8_name(q.fp8));
  check_same_device(fn, "src", src_in, "dst", ref);
  if (p.data.defined()) {
    FP8KIT_VALUE_CHECK(p.data.sizes() == src_in.sizes(), fn, ": src has shape ",
                       shape_str(src_in.sizes()), " but dst has shape ", shape_str(p.data.sizes()));
    check_contiguous(fn, "dst._data", p.data);
  }
  if (p.columnwise_data.defined()) {
    const auto cw = columnwise_shape(src_in.sizes());
    FP8KIT_VALUE_CHECK(p.columnwise_data.sizes() == at::IntArrayRef(cw), fn, ": src has shape ",
                       shape_str(src_in.sizes()), " whose columnwise layout is ", shape_str(cw),
                       " but dst's columnwise data has shape ",
                       shape_str(p.columnwise_data.sizes()));
    check_contiguous(fn, "dst._columnwise_data", p.columnwise_data);
  }
  check_state_scalar(fn, "dst._scale_inv", p.scale_inv);
  const at::Tensor src = src_in.contiguous();
  DeviceScope scope(src.device());
  q.quantize_to(src, p.data, p.columnwise_data, p.scale_inv);
}

std::string usage_str(const Quantizer& q) {
  return c10::str("fp8_dtype='", fp8_name(q.fp8), "', rowwise=", q.rowwise ? "True" : "False",
                  ", columnwise=", q.columnwise ? "True" : "False");
}

}  // namespace

Quantizer::Quantizer(fp8kit_dtype fp8_, bool rowwise_, bool columnwise_)
    : fp8(fp8_), rowwise(rowwise_), columnwise(columnwise_) {}

Float8Quantizer::Float8Quantizer(at::Tensor scale_, std::optional<at::Tensor> amax_,
                                 fp8kit_dtype fp8_, bool rowwise_, bool columnwise_)
    : Quantizer(fp8_, rowwise_, columnwise_), scale(std::move(scale_)), amax(std::move(amax_)) {
  constexpr const char* fn = "fp8kit.torch.Float8Quantizer";
  check_usage(fn, rowwise, columnwise);
  check_state_scalar(fn, "scale", scale);
  device_type_of(scale, fn, "scale");
  if (amax) {
    check_state_scalar(fn, "amax", *amax);
    check_same_device(fn, "amax", *amax, "scale", scale);
  }
}

void Float8Quantizer::check_device(const char* fn, const at::Tensor& x) const {
  check_same_device(fn, "x", x, "the quantizer's scale", scale);
}

void Float8Quantizer::quantize_to(const at::Tensor& x, const at::Tensor& data,
                                  const at::Tensor& columnwise_data, const at::Tensor& scale_inv) {
  ScalePtrs s;
  s.scale = scale.data_ptr<float>();
  s.scale_inv = scale_inv.data_ptr<float>();
  s.amax = amax ? amax->data_ptr<float>() : nullptr;
  quantize_into(x, fp8, data, columnwise_data, s, nullptr);
}

Float8CurrentScalingQuantizer::Float8CurrentScalingQuantizer(fp8kit_dtype fp8_, bool rowwise_,
                                                             bool columnwise_,
                                                             double amax_epsilon_,
                                                             bool power_2_scale_)
    : Quantizer(fp8_, rowwise_, columnwise_),
      amax_epsilon(amax_epsilon_),
      power_2_scale(power_2_scale_) {
  constexpr const char* fn = "fp8kit.torch.Float8CurrentScalingQuantizer";
  check_usage(fn, rowwise, columnwise);
  FP8KIT_VALUE_CHECK(amax_epsilon >= 0.0, fn, ": amax_epsilon is ", amax_epsilon,
                     "; it must be >= 0 (0 disables it)");
}

void Float8CurrentScalingQuantizer::quantize_to(const at::Tensor& x, const at::Tensor& data,
                                                const at::Tensor& columnwise_data,
                                                const at::Tensor& scale_inv) {
  // Scale and amax are per-call scratch; scale_inv is the result's own.
  at::Tensor scratch = at::empty({2}, x.options().dtype(at::kFloat));
  fp8kit_current_scaling_config cfg;
  cfg.amax_epsilon = static_cast<float>(amax_epsilon);
  cfg.power_2_scale = power_2_scale ? 1 : 0;
  ScalePtrs s;
  s.scale = scratch.data_ptr<float>();
  s.amax = s.scale + 1;
  s.scale_inv = scale_inv.data_ptr<float>();
  quantize_into(x, fp8, data, columnwise_data, s, &cfg);
}

void register_quantizers(py::module_& m) {
  py::class_<Quantizer>(m, "Quantizer",
                        "Base of fp8kit's quantizers: q(x) returns a Float8Tensor.")
      .def(
          "__call__",
          [](py::object self, const at::Tensor& x) {
            return quantize_new(self, self.cast<Quantizer&>(), x, "fp8kit Quantizer.__call__");
          },
          py::arg("x"))
      .def(
          "quantize",
          [](py::object self, const at::Tensor& x) {
            return quantize_new(self, self.cast<Quantizer&>(), x, "fp8kit Quantizer.quantize");
          },
          py::arg("x"), "Same as calling the quantizer.")
      .def(
          "update_quantized",
          [](Quantizer& q, const at::Tensor& src, py::handle dst) {
            update_quantized(q, src, dst);
            return py::reinterpret_borrow<py::object>(dst);
          },
          py::arg("src"), py::arg("dst"),
          "Re-quantizes src into the existing buffers of Float8Tensor dst; returns dst.")
      .def(
          "set_usage",
          [](Quantizer& q, std::optional<bool> rowwise, std::optional<bool> columnwise) {
            const bool r = rowwise.value_or(q.rowwise), c = columnwise.value_or(q.columnwise);
            check_usage("fp8kit Quantizer.set_usage", r, c);
            q.rowwise = r;
            q.columnwise = c;
          },
          py::arg("rowwise") = py::none(), py::arg("columnwise") = py::none())
      .def_property_readonly("fp8_dtype", [](const Quantizer& q) { return fp8_name(q.fp8); })
      .def_property_readonly("rowwise", [](const Quantizer& q) { return q.rowwise; })
      .def_property_readonly("columnwise", [](const Quantizer& q) { return q.columnwise; });

  py::class_<Float8Quantizer, Quantizer>(
      m, "Float8Quantizer",
      "Delayed-scaling quantizer: q = sat(rne(x * scale)) with the given float32[1] scale "
      "tensor (read at every call, so updating it in place changes later quantizations); "
      "writes max|x| to `amax` when given.")
      .def(py::init([](const at::Tensor& scale, const std::string& fp8_dtype,
                       std::optional<at::Tensor> amax, bool rowwise, bool columnwise) {
             return new Float8Quantizer(
                 scale, std::move(amax),
                 parse_fp8_name(fp8_dtype, "fp8kit.torch.Float8Quantizer", "fp8_dtype"), rowwise,
                 columnwise);
           }),
           py::arg("scale"), py::arg("fp8_dtype") = "e4m3", py::arg("amax") = py::none(),
           py::arg("rowwise") = true, py::arg("columnwise") = true)
      .def_readonly("scale", &Float8Quantizer::scale)
      .def_readonly("amax", &Float8Quantizer::amax)
      .def("copy",
           [](const Float8Quantizer& q) {
             return new Float8Quantizer(q.scale.clone(),
                                        q.amax ? std::optional<at::Tensor>(q.amax->clone())
                                               : std::nullopt,
                                        q.fp8, q.rowwise, q.columnwise);
           },
           "A quantizer with copies of this one's scale and amax tensors.")
      .def("to",
           [](const Float8Quantizer& q, const at::Device& device) {
             return new Float8Quantizer(q.scale.to(device),
                                        q.amax ? std::optional<at::Tensor>(q.amax->to(device))
                                               : std::nullopt,
                                        q.fp8, q.rowwise, q.columnwise);
           },
           py::arg("device"), "A copy whose state tensors live on `device`.")
      .def("__deepcopy__",
           [](const Float8Quantizer& q, py::handle /*memo*/) {
             return new Float8Quantizer(q.scale.clone(),
                                        q.amax ? std::optional<at::Tensor>(q.amax->clone())
                                               : std::nullopt,
                                        q.fp8, q.rowwise, q.columnwise);
           },
           py::arg("memo"))
      .def("__repr__",
           [](const Float8Quantizer& q) {
             return c10::str("Float8Quantizer(", usage_str(q), ", device=", q.scale.device().str(),
                             ")");
           })
      .def(py::pickle(
          [](const Float8Quantizer& q) {
            return py::make_tuple(q.scale, q.amax, std::string(fp8_name(q.fp8)), q.rowwise,
                                  q.columnwise);
          },
          [](const py::tuple& s) {
            FP8KIT_VALUE_CHECK(s.size() == 5, "fp8kit: bad Float8Quantizer pickle state");
            return new Float8Quantizer(
                s[0].cast<at::Tensor>(), s[1].cast<std::optional<at::Tensor>>(),
                parse_fp8_name(s[2].cast<std::string>(), "Float8Quantizer", "fp8_dtype"),
                s[3].cast<bool>(), s[4].cast<bool>());
          }));

  py::class_<Float8CurrentScalingQuantizer, Quantizer>(
      m, "Float8CurrentScalingQuantizer",
      "Current-scaling quantizer: scale = fp8_max / max(amax(x), amax_epsilon) (optionally a "
      "power of two; 1 for a zero or non-finite amax), computed per call.")
      .def(py::init([](const std::string& fp8_dtype, bool rowwise, bool columnwise,
                       double amax_epsilon, bool power_2_scale) {
             return new Float8CurrentScalingQuantizer(
                 parse_fp8_name(fp8_dtype, "fp8kit.torch.Float8CurrentScalingQuantizer",
                                "fp8_dtype"),
                 rowwise, columnwise, amax_epsilon, power_2_scale);
           }),
           py::arg("fp8_dtype") = "e4m3", py::arg("rowwise") = true, py::arg("columnwise") = true,
           py::arg("amax_epsilon") = 0.0, py::arg("power_2_scale") = false)
      .def_readonly("amax_epsilon", &Float8CurrentScalingQuantizer::amax_epsilon)
      .def_readonly("power_2_scale", &Float8CurrentScalingQuantizer::power_2_scale)
      .def("copy",
           [](const Float8CurrentScalingQuantizer& q) {
             return new Float8CurrentScalingQuantizer(q);
           })
      .def("to",
           [](const Float8CurrentScalingQuantizer& q, const at::Device&) {
             return new Float8CurrentScalingQuantizer(q);
           },
           py::arg("device"), "A copy (current scaling keeps no device state).")
      .def("__deepcopy__",
           [](const Float8CurrentScalingQuantizer& q, py::handle) {
             return new Float8CurrentScalingQuantizer(q);
           },
           py::arg("memo"))
      .def("__repr__",
           [](const Float8CurrentScalingQuantizer& q) {
             return c10::str("Float8CurrentScalingQuantizer(", usage_str(q),
                             ", amax_epsilon=", q.amax_epsilon,
                             ", power_2_scale=", q.power_2_scale ? "True" : "False", ")");
           })
      .def(py::pickle(
          [](const Float8CurrentScalingQuantizer& q) {
            return py::make_tuple(std::string(fp8_name(q.fp8)), q.rowwise, q.columnwise,
                                  q.amax_epsilon, q.power_2_scale);
          },
          [](const py::tuple& s) {
            FP8KIT_VALUE_CHECK(s.size() == 5, "fp8kit: bad Float8CurrentScalingQuantizer pickle state");
            return new Float8CurrentScalingQuantizer(
                parse_fp8_name(s[0].cast<std::string>(), "Float8CurrentScalingQuantizer",
                               "fp8_dtype"),
                s[1].cast<bool>(), s[2].cast<bool>(), s[3].cast<double>(), s[4].cast<bool>());
          }));
}

}  // namespace fp8kit_torch
