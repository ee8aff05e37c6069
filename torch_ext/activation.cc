// activation_forward / activation_backward: GELU (tanh) and SwiGLU with the
// FP8 cast of their outputs fused in (fp8kit/activation.h).
#include <optional>
#include <string>
#include <vector>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "fused_cast.h"
#include "fused_ops.h"
#include "fused_tensors.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

// "gelu" / "swiglu" -> the core's activation.
fp8kit_activation activation_of(const char* fn, const std::string& name) {
  if (name == "gelu") return FP8KIT_GELU;
  if (name == "swiglu") return FP8KIT_SWIGLU;
  C10_THROW_ERROR(ValueError,
                  c10::str(fn, ": activation is '", name, "'; use 'gelu' or 'swiglu'"));
}

// The shape of a = act(h): h's, with the last dimension halved for
// SwiGLU ([gate | up] -> F). Checks h's last dimension.
std::vector<int64_t> output_shape(const char* fn, fp8kit_activation act, const at::Tensor& h) {
  const int64_t last = h.size(-1);
  const int64_t multiple = act == FP8KIT_SWIGLU ? 2 * FP8KIT_GEMM_DIM_MULTIPLE
                                                : FP8KIT_GEMM_DIM_MULTIPLE;
  FP8KIT_VALUE_CHECK(last > 0 && last % multiple == 0, fn, ": h has last dimension ", last, "; ",
                     act == FP8KIT_SWIGLU ? "SwiGLU's h is [gate | up], 2F wide"
                                          : "GELU's h is F wide",
                     ", with F a positive multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
                     " (the inner dimension of the FP8 GEMM that reads the output)");
  std::vector<int64_t> s = h.sizes().vec();
  if (act == FP8KIT_SWIGLU) s.back() = last / 2;
  return s;
}

py::tuple activation_forward_binding(py::handle h_in, py::handle activation, py::handle state,
                                     py::handle slot_in, py::handle record_in,
                                     py::handle rowwise_in, py::handle columnwise_in,
                                     py::handle want_a_in) {
  FP8KIT_PROFILE_SCOPE("fp8kit::activation_forward");
  constexpr const char* fn = "fp8kit.torch.activation_forward";
  const std::string name = read_str(activation, c10::str(fn, ": activation"));
  const CastArgs cast = read_cast_args(fn, state, slot_in, record_in, rowwise_in, columnwise_in);
  const bool want_a = read_bool(want_a_in, c10::str(fn, ": want_a"));
  const ActivationForwardOut out =
      activation_forward(fn, read_tensor(h_in, c10::str(fn, ": h")), name, cast, want_a);
  return py::make_tuple(optional_tensor(out.cast.data), optional_tensor(out.cast.columnwise_data),
                        out.cast.scale_inv(), optional_tensor(out.a));
}

py::tuple activation_backward_binding(py::handle d_a_in, py::handle h_in, py::handle activation,
                                      py::handle state, py::handle slot_in, py::handle record_in,
                                      py::handle rowwise_in, py::handle columnwise_in,
                                      py::handle sums_dtype, py::handle want_dh_in) {
  FP8KIT_PROFILE_SCOPE("fp8kit::activation_backward");
  constexpr const char* fn = "fp8kit.torch.activation_backward";
  const std::string name = read_str(activation, c10::str(fn, ": activation"));
  const CastArgs cast = read_cast_args(fn, state, slot_in, record_in, rowwise_in, columnwise_in);
  const bool want_dh = read_bool(want_dh_in, c10::str(fn, ": want_dh"));
  const ActivationBackwardOut out = activation_backward(
      fn, read_tensor(d_a_in, c10::str(fn, ": d_a")), read_tensor(h_in, c10::str(fn, ": h")),
      name, cast, read_sums_dtype(fn, sums_dtype), want_dh);
  return py::make_tuple(optional_tensor(out.cast.data), optional_tensor(out.cast.columnwise_data),
                        out.cast.scale_inv(), optional_tensor(out.sums), optional_tensor(out.dh));
}

}  // namespace

ActivationForwardOut activation_forward(const char* fn, const at::Tensor& h_in,
                                        const std::string& activation, const CastArgs& cast,
                                        bool want_a) {
  const fp8kit_activation act = activation_of(fn, activation);
  LinearState& st = *cast.state;
  const int slot = cast.slot;
  const at::Tensor h = fused_input(fn, "h", h_in, st);
  const std::vector<int64_t> a_shape = output_shape(fn, act, h);

  ActivationForwardOut out;
  if (want_a) out.a = at::empty(a_shape, h.options());
  out.cast = alloc_fused_cast(st, slot, a_shape, cast.rowwise, cast.columnwise);
  const fp8kit_device_type dev = device_type_of(h, fn, "h");
  const fp8kit_tensor hd = describe(h, *high_precision_dtype(h.scalar_type()), dev);
  fp8kit_tensor ad = want_a ? describe(out.a, hd.dtype, dev) : fp8kit_tensor{};
  fp8kit_tensor values = hd;  // a's shape: where the cast's values live
  values.shape[values.rank - 1] = a_shape.back();
  {
    DeviceScope scope(st.device);
    const auto lock = lock_state(st.mu);
    fp8kit_tensor od;
    fp8kit_fused_cast fc;
    describe_fused_cast(st, slot, cast.record, out.cast, values, &od, &fc);
    void* stream = current_stream(h.device());
    check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
      return fp8kit_activation_forward(act, &hd, want_a ? &ad : nullptr, &od, &fc, stream);
    }));
    finish_fused_cast(st, slot, cast.record);
  }
  return out;
}

at::Tensor activation_forward_values(const char* fn, const at::Tensor& h_in,
                                     const std::string& activation) {
  const fp8kit_activation act = activation_of(fn, activation);
  const at::Tensor h = fused_input(fn, "h", h_in);
  const at::Tensor a = at::empty(output_shape(fn, act, h), h.options());
  const fp8kit_device_type dev = device_type_of(h, fn, "h");
  const fp8kit_tensor hd = describe(h, *high_precision_dtype(h.scalar_type()), dev);
  fp8kit_tensor ad = describe(a, hd.dtype, dev);
  DeviceScope scope(h.device());
  void* stream = current_stream(h.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_activation_forward(act, &hd, &ad, nullptr, nullptr, stream);
  }));
  return a;
}

at::Tensor activation_backward_values(const char* fn, const at::Tensor& d_a_in,
                                      const at::Tensor& h_in, const std::string& activation) {
  const fp8kit_activation act = activation_of(fn, activation);
  const at::Tensor h = fused_input(fn, "h", h_in);
  const at::Tensor d_a = fused_like(fn, "d_a", d_a_in, h, "h", output_shape(fn, act, h));
  const at::Tensor dh = at::empty_like(h);
  const fp8kit_device_type dev = device_type_of(h, fn, "h");
  const fp8kit_tensor hd = describe(h, *high_precision_dtype(h.scalar_type()), dev);
  const fp8kit_tensor dad = describe(d_a, hd.dtype, dev);
  fp8kit_tensor dhd = describe(dh, hd.dtype, dev);
  DeviceScope scope(h.device());
  void* stream = current_stream(h.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_activation_backward(act, &dad, &hd, &dhd, nullptr, nullptr, nullptr, stream);
  }));
  return dh;
}

ActivationBackwardOut activation_backward(const char* fn, const at::Tensor& d_a_in,
                                          const at::Tensor& h_in, const std::string& activation,
                                          const CastArgs& cast,
                                          std::optional<at::ScalarType> sums_dtype,
                                          bool want_dh) {
  const fp8kit_activation act = activation_of(fn, activation);
  LinearState& st = *cast.state;
  const int slot = cast.slot;
  const at::Tensor h = fused_input(fn, "h", h_in, st);
  const std::vector<int64_t> a_shape = output_shape(fn, act, h);
  const at::Tensor d_a = fused_like(fn, "d_a", d_a_in, h, "h", a_shape);
  const int64_t cols = h.size(-1), rows = h.numel() / cols;
  check_sums_dtype(fn, sums_dtype, cast.columnwise, rows, cols, "dh");

  ActivationBackwardOut out;
  if (want_dh) out.dh = at::empty_like(h);
  out.cast = alloc_fused_cast(st, slot, h.sizes(), cast.rowwise, cast.columnwise);
  const fp8kit_device_type dev = device_type_of(h, fn, "h");
  const fp8kit_tensor hd = describe(h, *high_precision_dtype(h.scalar_type()), dev);
  const fp8kit_tensor dad = describe(d_a, hd.dtype, dev);
  fp8kit_tensor dhd = want_dh ? describe(out.dh, hd.dtype, dev) : fp8kit_tensor{};
  {
    DeviceScope scope(st.device);
    const auto lock = lock_state(st.mu);  // the state and the sums' tile counters
    ColumnSums cs;
    if (sums_dtype) {
      cs = alloc_column_sums(st, rows, cols, *sums_dtype);
      out.sums = cs.sums;
    }
    fp8kit_tensor od;
    fp8kit_fused_cast fc;
    describe_fused_cast(st, slot, cast.record, out.cast, hd, &od, &fc);
    void* stream = current_stream(h.device());
    check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
      return fp8kit_activation_backward(act, &dad, &hd, want_dh ? &dhd : nullptr, &od, &fc,
                                        sums_dtype ? &cs.desc : nullptr, stream);
    }));
    finish_fused_cast(st, slot, cast.record);
  }
  return out;
}

void register_activation(py::module_& m) {
  m.def("activation_forward", &activation_forward_binding, py::arg("h"), py::arg("activation"),
        py::arg("state"), py::arg("slot"), py::arg("record"), py::arg("rowwise") = true,
        py::arg("columnwise") = false, py::arg("want_a") = false,
        "a = gelu(h) ('gelu', tanh approximation) or silu(gate) * up ('swiglu', h = [gate | up] "
        "along the last dimension) with the FP8 cast of the float32 a fused in, cast with slot "
        "`slot` of LinearState `state`. Returns (data, columnwise_data, scale_inv, a): the FP8 "
        "copies asked for (else None), 1/the scale used (float32[1]), a in h's dtype when "
        "want_a.");
  m.def("activation_backward", &activation_backward_binding, py::arg("d_a"), py::arg("h"),
        py::arg("activation"), py::arg("state"), py::arg("slot"), py::arg("record") = true,
        py::arg("rowwise") = true, py::arg("columnwise") = false,
        py::arg("sums_dtype") = py::none(), py::arg("want_dh") = false,
        "dh = d_a * act'(h) with its FP8 cast fused in (slot `slot` of `state`). Returns "
        "(data, columnwise_data, scale_inv, sums, dh): sums, when sums_dtype is a dtype, are "
        "dh's column sums in it (the bias gradient of the Linear that produced h; needs "
        "columnwise=True), dh in h's dtype when want_dh.");
}

}  // namespace fp8kit_torch
