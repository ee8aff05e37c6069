#include "quantizer.h"

#include <string>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "initialised.h"
#include "py_float8_tensor.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

void check_state_scalar(const char* fn, const char* arg, const at::Tensor& t) {
  check_dense(fn, arg, t);
  FP8KIT_TYPE_CHECK(t.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()), "; it must be a torch.float32 tensor of shape [1]");
  FP8KIT_VALUE_CHECK(t.numel() == 1, fn, ": ", arg, " has shape ", shape_str(t.sizes()),
                     "; it must be a torch.float32 tensor of shape [1]");
  check_contiguous(fn, arg, t);
}

// The quantizer's scale or amax tensor as a call finds it: it is the
// user's tensor (read and written at every call), so it may have been
// resized, re-typed or moved (resize_, set_, .data = ...) since the
// constructor checked it, and the core would then read or write past it.
void check_kept_scalar(const char* fn, const char* arg, const at::Tensor& t,
                       const at::Tensor& x) {
  const bool dense = t.has_storage() && t.layout() == at::kStrided &&
                     !t.key_set().has(c10::DispatchKey::Python);
  const bool f32 = dense && t.scalar_type() == at::kFloat;
  const bool ok = f32 && t.numel() == 1 && t.is_contiguous();
  if (C10_UNLIKELY(!ok)) {
    const std::string msg = c10::str(
        fn, ": the quantizer's ", arg, " is now ",
        dense ? dtype_str(t.scalar_type()) : std::string("a tensor without dense storage"),
        " of shape ", shape_str(t.sizes()), " on ", device_str(t.device()),
        "; it must stay the contiguous torch.float32 tensor of shape [1] it was constructed "
        "with (it was resized or replaced after construction): update its value in place "
        "with ", arg, ".fill_(...) or make a new quantizer");
    if (!f32) C10_THROW_ERROR(TypeError, msg);
    C10_THROW_ERROR(ValueError, msg);
  }
  check_same_device(fn, "x", x, c10::str("the quantizer's ", arg).c_str(), t);
}

// Quantizes `x` with `q` into a new Float8Tensor whose quantizer is `self`.
py::object quantize_new(py::handle self, Quantizer& q, const at::Tensor& x_in, const char* fn) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_high_precision(fn, "x", x_in);
  check_rank(fn, "x", x_in);
  device_type_of(x_in, fn, "x");
  q.check_state(fn, x_in);
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
  q.check_state(fn, src_in);
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
  check_quantizer_usage(fn, rowwise, columnwise);
  check_state_scalar(fn, "scale", scale);
  device_type_of(scale, fn, "scale");
  if (amax) {
    check_state_scalar(fn, "amax", *amax);
    check_same_device(fn, "amax", *amax, "scale", scale);
  }
}

void Float8Quantizer::check_state(const char* fn, const at::Tensor& x) const {
  check_kept_scalar(fn, "scale", scale, x);
  if (amax) check_kept_scalar(fn, "amax", *amax, x);
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
  check_quantizer_usage(fn, rowwise, columnwise);
  check_amax_epsilon(fn, amax_epsilon);
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

namespace {

constexpr ClassHint kBaseHint{
    "fp8kit.torch.Quantizer",
    "fp8kit.torch.Float8Quantizer(scale, fp8_dtype='e4m3', amax=None) or "
    "fp8kit.torch.Float8CurrentScalingQuantizer(fp8_dtype='e4m3') (Quantizer is their abstract "
    "base)"};
constexpr ClassHint kDelayedHint{
    "fp8kit.torch.Float8Quantizer",
    "fp8kit.torch.Float8Quantizer(scale, fp8_dtype='e4m3', amax=None, rowwise=True, "
    "columnwise=True)"};
constexpr ClassHint kCurrentHint{
    "fp8kit.torch.Float8CurrentScalingQuantizer",
    "fp8kit.torch.Float8CurrentScalingQuantizer(fp8_dtype='e4m3', rowwise=True, "
    "columnwise=True, amax_epsilon=0.0, power_2_scale=False)"};

// `self` of a base-class method: the hint names the class it really is.
Quantizer& quantizer_self(py::handle self) {
  if (is_instance_of(self, typeid(Float8Quantizer))) {
    return initialised<Quantizer>(self, kDelayedHint);
  }
  if (is_instance_of(self, typeid(Float8CurrentScalingQuantizer))) {
    return initialised<Quantizer>(self, kCurrentHint);
  }
  return initialised<Quantizer>(self, kBaseHint);
}
Float8Quantizer& delayed_self(py::handle self) {
  return initialised<Float8Quantizer>(self, kDelayedHint);
}
Float8CurrentScalingQuantizer& current_self(py::handle self) {
  return initialised<Float8CurrentScalingQuantizer>(self, kCurrentHint);
}

Float8Quantizer* delayed_copy(const Float8Quantizer& q, const std::optional<at::Device>& to) {
  auto move = [&](const at::Tensor& t) { return to ? t.to(*to, false, true) : t.clone(); };
  return new Float8Quantizer(move(q.scale),
                             q.amax ? std::optional<at::Tensor>(move(*q.amax)) : std::nullopt,
                             q.fp8, q.rowwise, q.columnwise);
}

}  // namespace

void register_quantizers(py::module_& m) {
  py::class_<Quantizer>(m, "Quantizer",
                        "Base of fp8kit's quantizers: q(x) returns a Float8Tensor.")
      .def(
          "__call__",
          [](py::handle self, py::handle x) {
            constexpr const char* fn = "fp8kit Quantizer.__call__";
            return quantize_new(self, quantizer_self(self), read_tensor(x, c10::str(fn, ": x")),
                                fn);
          },
          py::arg("x"))
      .def(
          "quantize",
          [](py::handle self, py::handle x) {
            constexpr const char* fn = "fp8kit Quantizer.quantize";
            return quantize_new(self, quantizer_self(self), read_tensor(x, c10::str(fn, ": x")),
                                fn);
          },
          py::arg("x"), "Same as calling the quantizer.")
      .def(
          "update_quantized",
          [](py::handle self, py::handle src, py::handle dst) {
            update_quantized(quantizer_self(self),
                             read_tensor(src, "fp8kit Quantizer.update_quantized: src"), dst);
            return py::reinterpret_borrow<py::object>(dst);
          },
          py::arg("src"), py::arg("dst"),
          "Re-quantizes src into the existing buffers of Float8Tensor dst; returns dst.")
      .def(
          "set_usage",
          [](py::handle self, std::optional<bool> rowwise, std::optional<bool> columnwise) {
            Quantizer& q = quantizer_self(self);
            const bool r = rowwise.value_or(q.rowwise), c = columnwise.value_or(q.columnwise);
            check_quantizer_usage("fp8kit Quantizer.set_usage", r, c);
            q.rowwise = r;
            q.columnwise = c;
          },
          py::arg("rowwise") = py::none(), py::arg("columnwise") = py::none())
      .def_property_readonly("fp8_dtype",
                             [](py::handle self) { return fp8_name(quantizer_self(self).fp8); })
      .def_property_readonly("rowwise",
                             [](py::handle self) { return quantizer_self(self).rowwise; })
      .def_property_readonly("columnwise",
                             [](py::handle self) { return quantizer_self(self).columnwise; });

  py::class_<Float8Quantizer, Quantizer>(
      m, "Float8Quantizer",
      "Delayed-scaling quantizer: q = sat(rne(x * scale)) with the given float32[1] scale "
      "tensor (read at every call, so updating it in place changes later quantizations; "
      "resizing or replacing it is an error at the next call); writes max|x| to `amax` when "
      "given. A scale that is not finite and > 0 (0, negative, inf, NaN) makes every output "
      "element NaN and scale_inv NaN: fp8kit's policy for a given scale (never a plausible "
      "result, and no device sync to check the value).")
      .def(py::init([](py::handle scale, py::handle fp8_dtype, py::handle amax, bool rowwise,
                       bool columnwise) {
             constexpr const char* fn = "fp8kit.torch.Float8Quantizer";
             const auto where = [&](const char* arg) { return c10::str(fn, ": ", arg); };
             std::optional<at::Tensor> amax_t;
             if (!amax.is_none()) amax_t = read_tensor(amax, where("amax"));
             return new Float8Quantizer(
                 read_tensor(scale, where("scale")), std::move(amax_t),
                 parse_fp8_name(read_str(fp8_dtype, where("fp8_dtype")), fn, "fp8_dtype"),
                 rowwise, columnwise);
           }),
           py::arg("scale"), py::arg("fp8_dtype") = "e4m3", py::arg("amax") = py::none(),
           py::arg("rowwise") = true, py::arg("columnwise") = true)
      .def_property_readonly("scale", [](py::handle self) { return delayed_self(self).scale; })
      .def_property_readonly("amax", [](py::handle self) { return delayed_self(self).amax; })
      .def(
          "copy", [](py::handle self) { return delayed_copy(delayed_self(self), std::nullopt); },
          "A quantizer with copies of this one's scale and amax tensors.")
      .def(
          "to",
          [](py::handle self, py::handle device) {
            const at::Device d = read_device(device, "fp8kit Float8Quantizer.to: device");
            return delayed_copy(delayed_self(self), d);
          },
          py::arg("device"), "A copy whose state tensors live on `device`.")
      .def(
          "__deepcopy__",
          [](py::handle self, py::handle /*memo*/) {
            return delayed_copy(delayed_self(self), std::nullopt);
          },
          py::arg("memo"))
      .def("__repr__",
           [](py::handle self) {
             const Float8Quantizer& q = delayed_self(self);
             return c10::str("Float8Quantizer(", usage_str(q), ", device=", q.scale.device().str(),
                             ")");
           })
      .def(py::pickle(
          [](py::handle self) {
            const Float8Quantizer& q = delayed_self(self);
            return py::make_tuple(q.scale, q.amax, std::string(fp8_name(q.fp8)), q.rowwise,
                                  q.columnwise);
          },
          [](const py::tuple& s) {
            constexpr const char* fn = "fp8kit.torch.Float8Quantizer.__setstate__";
            FP8KIT_VALUE_CHECK(s.size() == 5, fn, ": the pickled state has ", s.size(),
                               " entries; a Float8Quantizer pickles 5 (scale, amax, fp8_dtype, "
                               "rowwise, columnwise)");
            const auto where = [&](const char* what) { return c10::str(fn, ": ", what); };
            std::optional<at::Tensor> amax;
            if (!s[1].is_none()) amax = read_tensor(s[1], where("amax"));
            return new Float8Quantizer(
                read_tensor(s[0], where("scale")), std::move(amax),
                parse_fp8_name(read_str(s[2], where("fp8_dtype")), fn, "fp8_dtype"),
                read_bool(s[3], where("rowwise")), read_bool(s[4], where("columnwise")));
          }));

  py::class_<Float8CurrentScalingQuantizer, Quantizer>(
      m, "Float8CurrentScalingQuantizer",
      "Current-scaling quantizer: scale = fp8_max / max(amax(x), amax_epsilon) (optionally a "
      "power of two; 1 for a zero or non-finite amax), computed per call. amax_epsilon is a "
      "finite float >= 0.")
      .def(py::init([](py::handle fp8_dtype, bool rowwise, bool columnwise,
                       py::handle amax_epsilon, bool power_2_scale) {
             constexpr const char* fn = "fp8kit.torch.Float8CurrentScalingQuantizer";
             return new Float8CurrentScalingQuantizer(
                 parse_fp8_name(read_str(fp8_dtype, c10::str(fn, ": fp8_dtype")), fn,
                                "fp8_dtype"),
                 rowwise, columnwise,
                 read_epsilon(amax_epsilon, c10::str(fn, ": amax_epsilon")), power_2_scale);
           }),
           py::arg("fp8_dtype") = "e4m3", py::arg("rowwise") = true, py::arg("columnwise") = true,
           py::arg("amax_epsilon") = 0.0, py::arg("power_2_scale") = false)
      .def_property_readonly("amax_epsilon",
                             [](py::handle self) { return current_self(self).amax_epsilon; })
      .def_property_readonly("power_2_scale",
                             [](py::handle self) { return current_self(self).power_2_scale; })
      .def("copy",
           [](py::handle self) { return new Float8CurrentScalingQuantizer(current_self(self)); })
      .def(
          "to",
          [](py::handle self, py::handle device) {
            read_device(device, "fp8kit Float8CurrentScalingQuantizer.to: device");
            return new Float8CurrentScalingQuantizer(current_self(self));
          },
          py::arg("device"), "A copy (current scaling keeps no device state).")
      .def(
          "__deepcopy__",
          [](py::handle self, py::handle) {
            return new Float8CurrentScalingQuantizer(current_self(self));
          },
          py::arg("memo"))
      .def("__repr__",
           [](py::handle self) {
             const Float8CurrentScalingQuantizer& q = current_self(self);
             return c10::str("Float8CurrentScalingQuantizer(", usage_str(q),
                             ", amax_epsilon=", q.amax_epsilon,
                             ", power_2_scale=", q.power_2_scale ? "True" : "False", ")");
           })
      .def(py::pickle(
          [](py::handle self) {
            const Float8CurrentScalingQuantizer& q = current_self(self);
            return py::make_tuple(std::string(fp8_name(q.fp8)), q.rowwise, q.columnwise,
                                  q.amax_epsilon, q.power_2_scale);
          },
          [](const py::tuple& s) {
            constexpr const char* fn = "fp8kit.torch.Float8CurrentScalingQuantizer.__setstate__";
            FP8KIT_VALUE_CHECK(s.size() == 5, fn, ": the pickled state has ", s.size(),
                               " entries; a Float8CurrentScalingQuantizer pickles 5 (fp8_dtype, "
                               "rowwise, columnwise, amax_epsilon, power_2_scale)");
            const auto where = [&](const char* what) { return c10::str(fn, ": ", what); };
            return new Float8CurrentScalingQuantizer(
                parse_fp8_name(read_str(s[0], where("fp8_dtype")), fn, "fp8_dtype"),
                read_bool(s[1], where("rowwise")), read_bool(s[2], where("columnwise")),
                read_epsilon(s[3], where("amax_epsilon")), read_bool(s[4], where("power_2_scale")));
          }));
}

}  // namespace fp8kit_torch
