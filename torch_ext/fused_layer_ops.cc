// Two Linear pieces on their own: quantize_slot casts a tensor into a
// LinearState slot, as the Linear's steps cast theirs (the tests rebuild a
// layer's casts with it), and linear_plan returns the core's plan of which
// copies each cast writes and which the forward keeps (the fused layers
// ask their kernels for those copies).
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
namespace {

py::tuple quantize_slot_binding(py::handle state, py::handle x_in, py::handle slot_in,
                                py::handle record_in, py::handle rowwise_in,
                                py::handle columnwise_in, py::handle sums_dtype) {
  FP8KIT_PROFILE_SCOPE("fp8kit::quantize_slot");
  constexpr const char* fn = "fp8kit.torch.quantize_slot";
  const CastArgs cast = read_cast_args(fn, state, slot_in, record_in, rowwise_in, columnwise_in);
  const QuantizeSlotOut out = quantize_slot(fn, read_tensor(x_in, c10::str(fn, ": x")), cast,
                                            read_sums_dtype(fn, sums_dtype));
  return py::make_tuple(optional_tensor(out.cast.data), optional_tensor(out.cast.columnwise_data),
                        out.cast.scale_inv(), optional_tensor(out.sums));
}

py::tuple copies(fp8kit_copies c) { return py::make_tuple(c.rowwise != 0, c.columnwise != 0); }

py::tuple plan(int64_t tokens, int64_t in_features, int64_t out_features, bool dgrad, bool wgrad,
               bool non_tn) {
  LinearCall call;
  call.m = tokens;
  call.k = in_features;
  call.n = out_features;
  call.dgrad = dgrad;
  call.wgrad = wgrad;
  call.non_tn = non_tn;
  const fp8kit_linear_plan p = linear_plan(call);
  return py::make_tuple(copies(p.quantize[kInput]), copies(p.quantize[kWeight]),
                        copies(p.quantize[kGrad]), copies(p.saved_input),
                        copies(p.saved_weight), p.wgrad_columnwise != 0, p.wgrad_inner);
}

}  // namespace

QuantizeSlotOut quantize_slot(const char* fn, const at::Tensor& x_in, const CastArgs& cast,
                              std::optional<at::ScalarType> sums_dtype) {
  LinearState& st = *cast.state;
  const at::Tensor x = fused_input(fn, "x", x_in, st);
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  check_sums_dtype(fn, sums_dtype, cast.columnwise, rows, cols, "x");
  QuantizeSlotOut out;
  out.cast = alloc_fused_cast(st, cast.slot, x.sizes(), cast.rowwise, cast.columnwise);
  {
    DeviceScope scope(st.device);
    const auto lock = lock_state(st.mu);
    ColumnSums cs;
    SlotJob job{cast.slot, &x, out.cast.data, out.cast.columnwise_data,
                out.cast.scalars.data_ptr<float>()};
    if (sums_dtype) {
      cs = alloc_column_sums(st, rows, cols, *sums_dtype);
      out.sums = cs.sums;
      job.sums = cs.desc;
    }
    st.quantize_slots(&job, 1, cast.record);
  }
  return out;
}

void register_fused_layer_ops(py::module_& m) {
  m.def("quantize_slot", &quantize_slot_binding, py::arg("state"), py::arg("x"), py::arg("slot"),
        py::arg("record"), py::arg("rowwise") = true, py::arg("columnwise") = false,
        py::arg("sums_dtype") = py::none(),
        "Casts x to FP8 with slot `slot` of LinearState `state`, as the Linear layer casts its "
        "weight and grad_output (delayed scaling: the slot's scale, seeded from x when fresh; "
        "record: roll x's amax in). Returns (data, columnwise_data, scale_inv, sums): sums, "
        "when sums_dtype is a dtype, are x's column sums in it (needs columnwise=True).");
  m.def("linear_plan", &plan, py::arg("tokens"), py::arg("in_features"),
        py::arg("out_features"), py::arg("dgrad"), py::arg("wgrad"), py::arg("non_tn"),
        "The core's plan (fp8kit_linear_plan_make, weight [out, in]) as a tuple: the (rowwise, "
        "columnwise) copies the input's, the weight's and grad_output's casts write, the "
        "copies of the input and of the weight the forward keeps, whether wgrad reads "
        "columnwise copies, and wgrad's inner dimension (tokens, padded to "
        "GEMM_DIM_MULTIPLE when columnwise).");
}

}  // namespace fp8kit_torch
