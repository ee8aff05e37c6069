// The Linear GEMMs of the fused layers (fp8kit.torch.LayerNormLinear,
// LayerNormMLP), which run fp8kit.torch.Linear's own forward and backward
// (linear_forward.cc, linear_backward.cc: one protocol) on an input that
// their normalization or activation kernel has already cast:
//   linear_forward_cast_input   the weight's cast (or a weight already in
//                               FP8), the forward GEMM with its bias, and
//                               the weight copy backward keeps
//   linear_backward             dy's cast (its column sums the bias
//                               gradient), dgrad and wgrad from the copies
//                               the forward kept
//   linear_backward_cast_grad   the same GEMMs on a dy that the activation
//                               backward has already cast
// as pybind11 calls on a LinearState. Their dispatcher ops, which
// torch.compile traces, are in fused_dispatcher_ops.cc (linear_backward's
// is the Linear's own, in linear_dispatcher_ops.cc).
#include <optional>
#include <string>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "fused_cast.h"
#include "fused_ops.h"
#include "fused_tensors.h"
#include "linear_autograd.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {

CastInputForwardOut linear_forward_cast_input(const char* fn, LinearState& st, const CastInput& x,
                                              const at::Tensor& w, const at::Tensor& b,
                                              const FP8Weight* fp8_weight,
                                              bool fast_accumulation, bool record, bool dgrad,
                                              bool wgrad, const at::Tensor& statistics,
                                              bool own_buffers,
                                              std::optional<at::ScalarType> out_dtype) {
  LinearCall p = linear_call(fn, st, x.data, w, b, dgrad, wgrad, /*bgrad=*/false,
                             fast_accumulation, /*x_cast=*/true, out_dtype);
  check_f32_scalar(fn, "input_scale_inv", x.scale_inv, "input", x.data);
  DeviceScope scope(st.device);
  FP8Weight given;
  const FP8Weight* given_ptr =
      check_forward_extras(fn, st, w, statistics, fp8_weight, &p, &given);
  LinearSaved saved;
  saved.own_buffers = own_buffers;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  CastInputForwardOut out;
  out.y = linear_forward_below_autograd(st, x.data, w, b, p, record ? &saved : nullptr,
                                        given_ptr, &x);
  out.w_q = saved.w_q;
  out.w_scale_inv = saved.w_scale_inv;
  return out;
}

namespace {

std::optional<at::ScalarType> optional_dtype(py::handle v, const char* fn, const char* arg) {
  if (v.is_none()) return std::nullopt;
  return read_high_precision_dtype(v, fn, arg);
}

at::Tensor tensor_or_undefined(py::handle v, const char* fn, const char* arg) {
  return v.is_none() ? at::Tensor() : read_tensor(v, c10::str(fn, ": ", arg));
}

c10::intrusive_ptr<LinearState> state_ptr(py::handle state, const char* fn) {
  return c10::intrusive_ptr<LinearState>::reclaim_copy(
      &read_linear_state(state, c10::str(fn, ": state")));
}

py::tuple grads_tuple(const LinearGrads& g) {
  return py::make_tuple(optional_tensor(g.dx), optional_tensor(g.dw), optional_tensor(g.db));
}

py::tuple forward_binding(py::handle state, const std::string& name, py::handle x_data,
                          py::handle x_scale_inv,
                          py::handle weight, py::handle fp8_weight, py::handle bias,
                          py::handle fast_accumulation, py::handle record, py::handle dgrad,
                          py::handle wgrad, py::handle statistics, py::handle x_values,
                          py::handle out_dtype) {
  FP8KIT_PROFILE_SCOPE("fp8kit::linear_forward_cast_input");
  const char* fn = name.c_str();
  LinearState& st = read_linear_state(state, c10::str(fn, ": state"));
  const CastInput x{read_tensor(x_data, c10::str(fn, ": input_fp8")), at::Tensor(),
                    read_tensor(x_scale_inv, c10::str(fn, ": input_scale_inv")),
                    tensor_or_undefined(x_values, fn, "input_values")};
  const at::Tensor b = tensor_or_undefined(bias, fn, "bias");
  FP8Weight fw;
  if (!fp8_weight.is_none()) fw = read_fp8_weight(fp8_weight, fn);
  const CastInputForwardOut out = linear_forward_cast_input(
      fn, st, x, read_tensor(weight, c10::str(fn, ": weight")), b,
      fp8_weight.is_none() ? nullptr : &fw,
      read_bool(fast_accumulation, c10::str(fn, ": fast_accumulation")),
      read_bool(record, c10::str(fn, ": record")), read_bool(dgrad, c10::str(fn, ": dgrad")),
      read_bool(wgrad, c10::str(fn, ": wgrad")),
      tensor_or_undefined(statistics, fn, "statistics"), /*own_buffers=*/false,
      optional_dtype(out_dtype, fn, "out_dtype"));
  return py::make_tuple(out.y, optional_tensor(out.w_q), optional_tensor(out.w_scale_inv));
}

SavedCopies read_saved(const char* fn, py::handle x_q, py::handle x_scale_inv, py::handle w_q,
                       py::handle w_scale_inv) {
  return {tensor_or_undefined(x_q, fn, "input_fp8"),
          tensor_or_undefined(x_scale_inv, fn, "input_scale_inv"),
          tensor_or_undefined(w_q, fn, "weight_fp8"),
          tensor_or_undefined(w_scale_inv, fn, "weight_scale_inv")};
}

}  // namespace

void register_fused_linear(py::module_& m) {
  m.def("linear_forward_cast_input", &forward_binding, py::arg("state"), py::arg("name"),
        py::arg("input_fp8"),
        py::arg("input_scale_inv"), py::arg("weight"), py::arg("fp8_weight"), py::arg("bias"),
        py::arg("fast_accumulation"), py::arg("record"), py::arg("dgrad"), py::arg("wgrad"),
        py::arg("statistics") = py::none(), py::arg("input_values") = py::none(),
        py::arg("out_dtype") = py::none(),
        "fp8kit.torch.Linear's forward below autograd (errors name `name`, the layer and its "
        "weight) on an input already cast into `state`'s "
        "input slot (input_fp8 [M, K] its rowwise copy, input_scale_inv float32 [1]): the "
        "weight's cast (recorded when `record`; fp8_weight as linear_forward's), the FP8 "
        "GEMM with the bias. Returns (y, weight_fp8, weight_scale_inv): the weight copy the "
        "core's plan keeps for the gradients dgrad / wgrad (None when none). statistics: as "
        "linear_forward's, the input's row from input_values (the values input_fp8 holds). "
        "out_dtype: y's dtype (None: the weight's).");
  m.def(
      "linear_backward",
      [](py::handle state, py::handle grad_output, py::handle x_q, py::handle x_scale_inv,
         py::handle w_q, py::handle w_scale_inv, std::vector<int64_t> input_shape,
         bool forward_dgrad, bool forward_wgrad, bool dgrad, bool wgrad, bool bgrad,
         py::handle statistics, py::handle weight_dtype) {
        FP8KIT_PROFILE_SCOPE("fp8kit::linear_backward");
        constexpr const char* fn = "fp8kit.torch.linear_backward";
        const at::Tensor dy = read_tensor(grad_output, c10::str(fn, ": grad_output"));
        return grads_tuple(linear_backward_saved(
            fn, state_ptr(state, fn), dy, nullptr,
            read_saved(fn, x_q, x_scale_inv, w_q, w_scale_inv), input_shape, dy.size(-1),
            dy.scalar_type(), forward_dgrad, forward_wgrad, dgrad, wgrad, bgrad,
            tensor_or_undefined(statistics, fn, "statistics"),
            optional_dtype(weight_dtype, fn, "weight_dtype")));
      },
      py::arg("state"), py::arg("grad_output"), py::arg("input_fp8"), py::arg("input_scale_inv"),
      py::arg("weight_fp8"), py::arg("weight_scale_inv"), py::arg("input_shape"),
      py::arg("forward_dgrad"), py::arg("forward_wgrad"), py::arg("dgrad"), py::arg("wgrad"),
      py::arg("bgrad"), py::arg("statistics") = py::none(), py::arg("weight_dtype") = py::none(),
      "fp8kit.torch.Linear's backward below autograd from the copies its forward kept: "
      "(dx, dw, db), None where not computed; grad_output in the layer's dtype, dw in "
      "weight_dtype (None: the same).");
  m.def(
      "linear_backward_cast_grad",
      [](py::handle state, py::handle dy_data, py::handle dy_columnwise, py::handle dy_scale_inv,
         py::handle x_q, py::handle x_scale_inv, py::handle w_q, py::handle w_scale_inv,
         std::vector<int64_t> input_shape, int64_t out_features, py::handle dtype,
         bool forward_dgrad, bool forward_wgrad, bool dgrad, bool wgrad, py::handle statistics,
         py::handle dy_values, py::handle weight_dtype) {
        FP8KIT_PROFILE_SCOPE("fp8kit::linear_backward_cast_grad");
        constexpr const char* fn = "fp8kit.torch.linear_backward_cast_grad";
        const CastInput dy{tensor_or_undefined(dy_data, fn, "grad_output_fp8"),
                           tensor_or_undefined(dy_columnwise, fn, "grad_output_columnwise"),
                           read_tensor(dy_scale_inv, c10::str(fn, ": grad_output_scale_inv")),
                           tensor_or_undefined(dy_values, fn, "grad_output_values")};
        const LinearGrads g = linear_backward_saved(
            fn, state_ptr(state, fn), at::Tensor(), &dy,
            read_saved(fn, x_q, x_scale_inv, w_q, w_scale_inv), input_shape, out_features,
            read_high_precision_dtype(dtype, fn, "dtype"), forward_dgrad, forward_wgrad, dgrad,
            wgrad, /*bgrad=*/false, tensor_or_undefined(statistics, fn, "statistics"),
            optional_dtype(weight_dtype, fn, "weight_dtype"));
        return py::make_tuple(optional_tensor(g.dx), optional_tensor(g.dw));
      },
      py::arg("state"), py::arg("grad_output_fp8"), py::arg("grad_output_columnwise"),
      py::arg("grad_output_scale_inv"), py::arg("input_fp8"), py::arg("input_scale_inv"),
      py::arg("weight_fp8"), py::arg("weight_scale_inv"), py::arg("input_shape"),
      py::arg("out_features"), py::arg("dtype"), py::arg("forward_dgrad"),
      py::arg("forward_wgrad"), py::arg("dgrad"), py::arg("wgrad"),
      py::arg("statistics") = py::none(), py::arg("grad_output_values") = py::none(),
      py::arg("weight_dtype") = py::none(),
      "linear_backward's dgrad and wgrad on a grad_output already cast into `state`'s "
      "grad_output slot (its copies per the core's plan and scale_inv): (dx, dw) in `dtype` "
      "(dw in weight_dtype when given), None where not computed; statistics' grad_output row "
      "from grad_output_values.");
}

}  // namespace fp8kit_torch
