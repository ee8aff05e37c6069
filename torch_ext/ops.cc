// The functional ops (ops.h) and their pybind11 bindings. Every output is
// allocated through PyTorch's allocator on the input's device; CUDA work
// goes to PyTorch's current stream of that device. Inputs that are not
// contiguous are made contiguous (a copy); outputs passed in (out=,
// amax_out=, state tensors) must be contiguous.
#include "ops.h"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "block_ops.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "fp8kit/linear.h"
#include "gemm_args.h"
#include "linear_state.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

at::Tensor f32_scalar_out(const at::Tensor& like) {
  return at::empty({1}, like.options().dtype(at::kFloat));
}

// One GEMM operand from its optional rowwise data and optional columnwise
// data: returns the descriptor with the logical 2-D rowwise shape.
fp8kit_tensor operand(const char* fn, const char* name, const char* name_cw,
                      const char* sinv_name, const OptTensor& x, const OptTensor& x_cw,
                      const at::Tensor& scale_inv, at::Device* device) {
  FP8KIT_VALUE_CHECK(x || x_cw, fn, ": ", name, " and ", name_cw, " are both None; pass ", name,
                     "'s rowwise data, its columnwise data, or both");
  const at::Tensor& ref = x ? *x : *x_cw;
  const char* ref_name = x ? name : name_cw;
  fp8kit_dtype f = check_fp8(fn, ref_name, ref);
  const OperandShape shape = gemm_operand_shape(fn, name, x, name_cw, x_cw);
  if (x) check_contiguous(fn, name, *x);
  if (x_cw) {
    const fp8kit_dtype ft = check_fp8(fn, name_cw, *x_cw);
    FP8KIT_TYPE_CHECK(ft == f, fn, ": ", name, " is ", fp8_name(f), " but ", name_cw, " is ",
                      fp8_name(ft), "; both layouts of one operand hold the same FP8 data");
    check_contiguous(fn, name_cw, *x_cw);
    check_same_device(fn, name_cw, *x_cw, ref_name, ref);
    FP8KIT_VALUE_CHECK(!x || (x_cw->size(0) == shape.cols && x_cw->size(1) == shape.rows), fn,
                       ": ", name_cw, " has shape ", shape_str(x_cw->sizes()), " but ", name,
                       " has shape ", shape_str(x->sizes()), " whose columnwise layout is [",
                       shape.cols, ", ", shape.rows, "]");
  }
  check_f32_scalar(fn, sinv_name, scale_inv, ref_name, ref);
  check_contiguous(fn, sinv_name, scale_inv);
  device_type_of(ref, fn, ref_name);
  *device = ref.device();
  return gemm_operand(ref.device(), f, shape.rows, shape.cols, x ? x->data_ptr() : nullptr,
                      x_cw ? x_cw->data_ptr() : nullptr, scale_inv.data_ptr<float>());
}

}  // namespace

at::Tensor amax(const char* fn, const at::Tensor& x_in) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const at::Tensor x = contiguous_high_precision(fn, "x", x_in);
  DeviceScope scope(x.device());
  at::Tensor out = at::empty({}, x.options().dtype(at::kFloat));
  amax_into(x, out.data_ptr<float>());
  return out;
}

std::tuple<OptTensor, OptTensor, at::Tensor> quantize(const char* fn, const at::Tensor& x_in,
                                                      const at::Tensor& scale, fp8kit_dtype f,
                                                      bool rowwise, bool columnwise,
                                                      const OptTensor& amax_out) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; ask for at least one output");
  const at::Tensor x = contiguous_high_precision(fn, "x", x_in);
  check_f32_scalar(fn, "scale", scale, "x", x);
  check_contiguous(fn, "scale", scale);
  if (amax_out) {
    check_f32_scalar(fn, "amax_out", *amax_out, "x", x);
    check_contiguous(fn, "amax_out", *amax_out);
  }
  DeviceScope scope(x.device());
  const at::Tensor data = rowwise ? alloc_rowwise(x, f) : at::Tensor();
  const at::Tensor columnwise_data = columnwise ? alloc_columnwise(x, f) : at::Tensor();
  at::Tensor scale_inv = f32_scalar_out(x);
  ScalePtrs s;
  s.scale = scale.data_ptr<float>();
  s.scale_inv = scale_inv.data_ptr<float>();
  s.amax = amax_out ? amax_out->data_ptr<float>() : nullptr;
  quantize_into(x, f, data, columnwise_data, s, nullptr);
  return {rowwise ? OptTensor(data) : std::nullopt,
          columnwise ? OptTensor(columnwise_data) : std::nullopt, scale_inv};
}

std::tuple<OptTensor, OptTensor, at::Tensor, at::Tensor, at::Tensor> quantize_current_scaling(
    const char* fn, const at::Tensor& x_in, fp8kit_dtype f, bool rowwise, bool columnwise,
    double amax_epsilon, bool power_2_scale) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; ask for at least one output");
  check_amax_epsilon(fn, amax_epsilon);
  const at::Tensor x = contiguous_high_precision(fn, "x", x_in);
  DeviceScope scope(x.device());
  const at::Tensor data = rowwise ? alloc_rowwise(x, f) : at::Tensor();
  const at::Tensor columnwise_data = columnwise ? alloc_columnwise(x, f) : at::Tensor();
  at::Tensor scale = f32_scalar_out(x), scale_inv = f32_scalar_out(x), amax_t = f32_scalar_out(x);
  fp8kit_current_scaling_config cfg;
  cfg.amax_epsilon = static_cast<float>(amax_epsilon);
  cfg.power_2_scale = power_2_scale ? 1 : 0;
  ScalePtrs s;
  s.scale = scale.data_ptr<float>();
  s.scale_inv = scale_inv.data_ptr<float>();
  s.amax = amax_t.data_ptr<float>();
  quantize_into(x, f, data, columnwise_data, s, &cfg);
  return {rowwise ? OptTensor(data) : std::nullopt,
          columnwise ? OptTensor(columnwise_data) : std::nullopt, scale, scale_inv, amax_t};
}

at::Tensor dequantize(const char* fn, const at::Tensor& data_in, const at::Tensor& scale_inv,
                      at::ScalarType out_dtype, bool from_columnwise,
                      const std::optional<std::vector<int64_t>>& shape) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const fp8kit_dtype f = check_fp8(fn, "data", data_in);
  device_type_of(data_in, fn, "data");
  FP8KIT_TYPE_CHECK(high_precision_dtype(out_dtype).has_value(), fn, ": out_dtype is ",
                    dtype_str(out_dtype),
                    "; use torch.float32, torch.bfloat16 or torch.float16");
  check_f32_scalar(fn, "scale_inv", scale_inv, "data", data_in);
  check_contiguous(fn, "scale_inv", scale_inv);
  const at::Tensor data = data_in.contiguous();
  const std::vector<int64_t> logical = dequantized_shape(fn, data, from_columnwise, shape);
  DeviceScope scope(data.device());
  at::Tensor out = at::empty(logical, data.options().dtype(out_dtype));
  dequantize_into(data, from_columnwise, logical, f, scale_inv.data_ptr<float>(), out);
  return out;
}

at::Tensor columnwise_from_rowwise(const char* fn, const at::Tensor& data_in) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const fp8kit_dtype f = check_fp8(fn, "data", data_in);
  device_type_of(data_in, fn, "data");
  const at::Tensor data = data_in.contiguous();
  DeviceScope scope(data.device());
  at::Tensor out = at::empty(columnwise_shape(data.sizes()), data.options());
  columnwise_from_rowwise_into(data, f, out);
  return out;
}

void delayed_scaling_update(const char* fn, const std::vector<at::Tensor>& histories,
                            const std::vector<at::Tensor>& amaxes,
                            const std::vector<at::Tensor>& scales,
                            const std::vector<at::Tensor>& scale_invs,
                            const std::vector<std::string>& fp8_dtypes, int64_t margin,
                            const std::string& amax_reduction) {
  const size_t n = histories.size();
  FP8KIT_VALUE_CHECK(amaxes.size() == n && scales.size() == n && scale_invs.size() == n &&
                         fp8_dtypes.size() == n,
                     fn, ": amax_histories, amaxes, scales, scale_invs and fp8_dtypes must have the "
                     "same length (one entry per tensor), got ", n, ", ", amaxes.size(), ", ",
                     scales.size(), ", ", scale_invs.size(), " and ", fp8_dtypes.size());
  FP8KIT_VALUE_CHECK(margin >= 0 && margin <= FP8KIT_MARGIN_MAX, fn, ": margin is ", margin,
                     "; use an int in [0, ", FP8KIT_MARGIN_MAX, "]");
  const fp8kit_amax_reduction red = parse_amax_reduction(amax_reduction, fn, "amax_reduction");
  if (n == 0) return;
  const at::Tensor& ref = histories[0];
  std::vector<fp8kit_delayed_scaling_state> states(n);
  int64_t len = -1;
  for (size_t i = 0; i < n; ++i) {
    const std::string h = c10::str("amax_histories[", i, "]");
    const at::Tensor& hist = histories[i];
    check_dense(fn, h.c_str(), hist);
    FP8KIT_TYPE_CHECK(hist.scalar_type() == at::kFloat, fn, ": ", h, " has dtype ",
                      dtype_str(hist.scalar_type()), "; amax histories are torch.float32");
    FP8KIT_VALUE_CHECK(hist.dim() == 1 && hist.numel() >= 1, fn, ": ", h, " has shape ",
                       shape_str(hist.sizes()), "; each history is 1-D [amax_history_len]");
    check_contiguous(fn, h.c_str(), hist);
    check_same_device(fn, h.c_str(), hist, "amax_histories[0]", ref);
    if (len < 0) len = hist.numel();
    FP8KIT_VALUE_CHECK(hist.numel() == len, fn, ": ", h, " has length ", hist.numel(),
                       " but amax_histories[0] has length ", len,
                       "; one call updates histories of one length (group them by length)");
    const std::string a = c10::str("amaxes[", i, "]"), s = c10::str("scales[", i, "]"),
                      si = c10::str("scale_invs[", i, "]");
    check_f32_scalar(fn, a.c_str(), amaxes[i], "amax_histories[0]", ref);
    check_f32_scalar(fn, s.c_str(), scales[i], "amax_histories[0]", ref);
    check_f32_scalar(fn, si.c_str(), scale_invs[i], "amax_histories[0]", ref);
    states[i].amax_history = hist.data_ptr<float>();
    states[i].amax = amaxes[i].data_ptr<float>();
    states[i].scale = scales[i].data_ptr<float>();
    states[i].scale_inv = scale_invs[i].data_ptr<float>();
    states[i].fp8_dtype = parse_fp8_name(fp8_dtypes[i], fn, c10::str("fp8_dtypes[", i, "]").c_str());
  }
  device_type_of(ref, fn, "amax_histories[0]");
  DeviceScope scope(ref.device());
  fp8kit_delayed_scaling_config cfg;
  FP8KIT_VALUE_CHECK(len <= FP8KIT_AMAX_HISTORY_LEN_MAX, fn, ": amax_histories[0] has length ",
                     len, "; a history holds at most ", FP8KIT_AMAX_HISTORY_LEN_MAX, " amaxes");
  cfg.amax_history_len = static_cast<int>(len);
  cfg.margin = static_cast<int>(margin);
  cfg.amax_reduction = red;
  delayed_update(states.data(), static_cast<int>(n), cfg, ref.device());
}

at::Tensor gemm(const char* fn, const OptTensor& a, const at::Tensor& a_scale_inv,
                const OptTensor& a_columnwise, const OptTensor& b, const at::Tensor& b_scale_inv,
                const OptTensor& b_columnwise, bool trans_a, bool trans_b,
                at::ScalarType out_dtype, const OptTensor& bias, bool gelu,
                const OptTensor& gelu_aux, bool accumulate, bool use_split_accumulator,
                const OptTensor& d_scale, const OptTensor& d_amax, const OptTensor& out) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Device dev_a(at::kCPU), dev_b(at::kCPU);
  const fp8kit_tensor da =
      operand(fn, "a", "a_columnwise", "a_scale_inv", a, a_columnwise, a_scale_inv, &dev_a);
  const fp8kit_tensor db =
      operand(fn, "b", "b_columnwise", "b_scale_inv", b, b_columnwise, b_scale_inv, &dev_b);
  const GemmShape shape = gemm_shape(fn, da, dev_a, db, dev_b, trans_a, trans_b);
  const int64_t m = shape.m, n = shape.n;
  const at::Device device = dev_a;
  const at::Tensor& ref_a = a ? *a : *a_columnwise;  // the tensor "a" in messages
  const auto d_fp8 = fp8_dtype_of(out_dtype);
  const auto d_hp = high_precision_dtype(out_dtype);
  FP8KIT_TYPE_CHECK(d_fp8 || d_hp, fn, ": out_dtype is ", dtype_str(out_dtype),
                    "; use torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn or "
                    "torch.float8_e5m2");
  const at::Tensor d = gemm_output(fn, out, out_dtype, shape, accumulate, "a", ref_a);
  fp8kit_tensor dt = describe(d, d_fp8 ? *d_fp8 : *d_hp, da.device_type);
  if (d_fp8) {
    dt.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    FP8KIT_VALUE_CHECK(d_scale.has_value(), fn, ": out_dtype is ", dtype_str(out_dtype),
                       " so d_scale (float32[1], the output's quantization scale) is required");
  }
  if (d_scale) {
    FP8KIT_VALUE_CHECK(d_fp8.has_value(), fn,
                       ": d_scale is only used for an FP8 out_dtype; drop it or pick an FP8 "
                       "out_dtype");
    check_f32_scalar(fn, "d_scale", *d_scale, "a", ref_a);
    dt.scale = d_scale->data_ptr<float>();
  }
  if (d_amax) {
    FP8KIT_VALUE_CHECK(d_fp8.has_value(), fn,
                       ": d_amax is only written for an FP8 out_dtype; drop it or pick an FP8 "
                       "out_dtype");
    check_f32_scalar(fn, "d_amax", *d_amax, "a", ref_a);
    dt.amax = d_amax->data_ptr<float>();
  }
  fp8kit_gemm_config cfg = gemm_config(trans_a, trans_b, accumulate, use_split_accumulator);
  at::Tensor bias_c;
  if (bias) {
    bias_c = set_gemm_bias(fn, *bias, high_precision_dtype(bias->scalar_type()),
                           "use torch.bfloat16 (or torch.float16 with a float16 output)", n, "a",
                           ref_a, &cfg);
  }
  if (gelu) {
    cfg.epilogue = bias ? FP8KIT_EPILOGUE_GELU_BIAS : FP8KIT_EPILOGUE_GELU;
  } else {
    cfg.epilogue = bias ? FP8KIT_EPILOGUE_BIAS : FP8KIT_EPILOGUE_DEFAULT;
  }
  if (gelu_aux) {
    FP8KIT_VALUE_CHECK(gelu, fn, ": gelu_aux is only written with gelu=True");
    check_dense(fn, "gelu_aux", *gelu_aux);
    FP8KIT_TYPE_CHECK(gelu_aux->scalar_type() == out_dtype, fn, ": gelu_aux has dtype ",
                      dtype_str(gelu_aux->scalar_type()), "; it must match out_dtype ",
                      dtype_str(out_dtype));
    FP8KIT_VALUE_CHECK(gelu_aux->numel() == m * n, fn, ": gelu_aux has shape ",
                       shape_str(gelu_aux->sizes()), " but must hold [", m, ", ", n, "]");
    check_contiguous(fn, "gelu_aux", *gelu_aux);
    check_same_device(fn, "gelu_aux", *gelu_aux, "a", ref_a);
    cfg.gelu_aux = gelu_aux->data_ptr();
    cfg.gelu_aux_numel = m * n;
  }
  DeviceScope scope(device);
  gemm_call(da, db, dt, cfg, device);
  return d;
}

namespace {

bool supports_non_tn_fp8_gemm(const at::Device& device) {
  return supports_non_tn(
      capability_query_device("fp8kit.torch.supports_non_tn_fp8_gemm", device));
}

}  // namespace

void register_ops(py::module_& m) {
  // The core's constants, so that Python repeats none of them.
  py::dict fp8_max;
  for (fp8kit_dtype f : {FP8KIT_E4M3, FP8KIT_E5M2}) fp8_max[fp8_name(f)] = fp8kit_fp8_max(f);
  m.attr("FP8_MAX") = fp8_max;
  m.attr("GEMM_DIM_MULTIPLE") = FP8KIT_GEMM_DIM_MULTIPLE;
  m.attr("GEMM_ROW_BYTES_MULTIPLE") = FP8KIT_GEMM_ROW_BYTES_MULTIPLE;
  m.attr("BLOCK_GEMM_MN_MULTIPLE") = FP8KIT_BLOCK_GEMM_MN_MULTIPLE;
  m.attr("BLOCK_SCALE_INNER_MULTIPLE") = FP8KIT_BLOCK_SCALE_INNER_MULTIPLE;
  // Floats from one group's scale to the next (fp8kit/grouped.h).
  m.attr("GROUP_SCALE_STRIDE") = FP8KIT_GROUP_SCALE_STRIDE;
  m.attr("MAX_GROUPS") = FP8KIT_MAX_GROUPS;
  m.def(
      "grouped_block_scales_floats",
      [](int64_t rows, int64_t groups, int64_t features, const std::string& mode, bool columnwise) {
        return fp8kit_grouped_block_scales_floats(
            rows, groups, features, parse_block_mode(mode, "grouped_block_scales_floats", "mode"),
            columnwise ? 1 : 0);
      },
      py::arg("rows"), py::arg("groups"), py::arg("features"), py::arg("mode"),
      py::arg("columnwise"),
      "fp8kit_grouped_block_scales_floats: the floats one copy's block scales of a padded "
      "grouped tensor can take (the fake kernels' rule is checked against it)");
  // The slots of a Linear's scaling state (fp8kit_linear_slot).
  m.attr("SLOT_INPUT") = int(FP8KIT_SLOT_INPUT);
  m.attr("SLOT_WEIGHT") = int(FP8KIT_SLOT_WEIGHT);
  m.attr("SLOT_GRAD_OUTPUT") = int(FP8KIT_SLOT_GRAD_OUTPUT);
  m.attr("NUM_SLOTS") = int(FP8KIT_NUM_SLOTS);
  // One quantization's scalars block (linear_state.h): its length in
  // floats and where scale_inv sits, for the fake kernels' shapes.
  m.attr("SCALARS_LEN") = kScalars;
  m.attr("SCALARS_SCALE_INV") = kScaleInv;
  // The delayed-scaling recipe ranges (fp8kit/delayed_scaling.h), which
  // fp8kit.recipe states too.
  m.attr("MARGIN_MAX") = FP8KIT_MARGIN_MAX;
  m.attr("AMAX_HISTORY_LEN_MAX") = FP8KIT_AMAX_HISTORY_LEN_MAX;
  py::dict reduction_codes;
  for (fp8kit_amax_reduction r : {FP8KIT_AMAX_MAX, FP8KIT_AMAX_MOST_RECENT}) {
    reduction_codes[amax_reduction_name(r)] = static_cast<int>(r);
  }
  m.attr("AMAX_REDUCTION_CODES") = reduction_codes;
  m.def(
      "columnwise_shape",
      [](const std::vector<int64_t>& shape) {
        const std::vector<int64_t> cw = columnwise_shape(shape);
        return py::make_tuple(cw[0], cw[1]);
      },
      py::arg("shape"),
      "The shape of a tensor's columnwise copy: (shape[-1], prod(shape[:-1])); (1, 1) for a "
      "0-d tensor.");

  m.def("amax", [](const at::Tensor& x) { return amax("fp8kit.torch.amax", x); }, py::arg("x"),
        "max |x| over the whole tensor as a float32 0-d tensor on x.device (NaN if any NaN).");
  m.def(
      "quantize",
      [](const at::Tensor& x, const at::Tensor& scale, const std::string& fp8_dtype, bool rowwise,
         bool columnwise, const OptTensor& amax_out) {
        constexpr const char* fn = "fp8kit.torch.quantize";
        return quantize(fn, x, scale, parse_fp8_name(fp8_dtype, fn, "fp8_dtype"), rowwise,
                        columnwise, amax_out);
      },
      py::arg("x"), py::arg("scale"), py::arg("fp8_dtype"),
      py::arg("rowwise") = true, py::arg("columnwise") = false, py::arg("amax_out") = py::none(),
      "Per-tensor quantization with a given scale: returns (data or None, columnwise_data or "
      "None, scale_inv); columnwise_data is the [last dim, prod(leading dims)] transpose. A "
      "scale that is not finite and > 0 (0, negative, inf, NaN) makes every output element "
      "NaN and scale_inv NaN (fp8kit's policy: never a plausible result, no device sync).");
  m.def(
      "quantize_current_scaling",
      [](const at::Tensor& x, const std::string& fp8_dtype, bool rowwise, bool columnwise,
         double amax_epsilon, bool power_2_scale) {
        constexpr const char* fn = "fp8kit.torch.quantize_current_scaling";
        return quantize_current_scaling(fn, x, parse_fp8_name(fp8_dtype, fn, "fp8_dtype"),
                                        rowwise, columnwise, amax_epsilon, power_2_scale);
      },
      py::arg("x"), py::arg("fp8_dtype"),
      py::arg("rowwise") = true, py::arg("columnwise") = false, py::arg("amax_epsilon") = 0.0,
      py::arg("power_2_scale") = false,
      "Current scaling: returns (data or None, columnwise_data or None, scale, scale_inv, "
      "amax).");
  m.def(
      "dequantize",
      [](const at::Tensor& data, const at::Tensor& scale_inv, at::ScalarType out_dtype,
         bool from_columnwise, const std::optional<std::vector<int64_t>>& shape) {
        return dequantize("fp8kit.torch.dequantize", data, scale_inv, out_dtype,
                          from_columnwise, shape);
      },
      py::arg("data"), py::arg("scale_inv"), py::arg("out_dtype"),
      py::arg("from_columnwise") = false, py::arg("shape") = py::none(),
      "data * scale_inv in out_dtype; from_columnwise reads [last, prod(leading)] data and "
      "returns the tensor of `shape` (default: the 2-D transpose).");
  m.def(
      "columnwise_from_rowwise",
      [](const at::Tensor& data) {
        return columnwise_from_rowwise("fp8kit.torch.columnwise_from_rowwise", data);
      },
      py::arg("data"),
      "The columnwise copy of FP8 data: its [prod(leading dims), last dim] view transposed, "
      "byte for byte.");
  m.def(
      "delayed_scaling_update",
      [](const std::vector<at::Tensor>& histories, const std::vector<at::Tensor>& amaxes,
         const std::vector<at::Tensor>& scales, const std::vector<at::Tensor>& scale_invs,
         const std::vector<std::string>& fp8_dtypes, int64_t margin,
         const std::string& amax_reduction) {
        delayed_scaling_update("fp8kit.torch.delayed_scaling_update", histories, amaxes, scales,
                               scale_invs, fp8_dtypes, margin, amax_reduction);
      },
      py::arg("amax_histories"),
      py::arg("amaxes"), py::arg("scales"), py::arg("scale_invs"), py::arg("fp8_dtypes"),
      py::arg("margin") = 0, py::arg("amax_reduction") = "max",
      "Rolls each amax history, reduces it and recomputes scale and scale_inv, for all tensors "
      "in one call (see common/include/fp8kit/delayed_scaling.h).");
  m.def(
      "gemm",
      [](const OptTensor& a, const at::Tensor& a_scale_inv, const OptTensor& a_columnwise,
         const OptTensor& b, const at::Tensor& b_scale_inv, const OptTensor& b_columnwise,
         bool trans_a, bool trans_b, at::ScalarType out_dtype, const OptTensor& bias, bool gelu,
         const OptTensor& gelu_aux, bool accumulate, bool use_split_accumulator,
         const OptTensor& d_scale, const OptTensor& d_amax, const OptTensor& out) {
        return gemm("fp8kit.torch.gemm", a, a_scale_inv, a_columnwise, b, b_scale_inv,
                    b_columnwise, trans_a, trans_b, out_dtype, bias, gelu, gelu_aux, accumulate,
                    use_split_accumulator, d_scale, d_amax, out);
      },
      py::arg("a"), py::arg("a_scale_inv"), py::arg("a_columnwise"),
      py::arg("b"), py::arg("b_scale_inv"), py::arg("b_columnwise"), py::arg("trans_a") = false,
      py::arg("trans_b") = false, py::arg("out_dtype") = at::kBFloat16,
      py::arg("bias") = py::none(), py::arg("gelu") = false, py::arg("gelu_aux") = py::none(),
      py::arg("accumulate") = false, py::arg("use_split_accumulator") = true,
      py::arg("d_scale") = py::none(), py::arg("d_amax") = py::none(),
      py::arg("out") = py::none(),
      "D = (op(a) * a_scale_inv) @ (op(b) * b_scale_inv) (+ bias) (GELU); TN canonicalization "
      "by the core (see common/include/fp8kit/gemm.h).");
  m.def("supports_non_tn_fp8_gemm", &supports_non_tn_fp8_gemm, py::arg("device"),
        "Whether FP8 GEMMs on `device` accept non-TN layouts (the core's cached answer).");
  m.def("built_with_cuda", [] {
#ifdef FP8KIT_TORCH_CUDA
    return fp8kit_built_with_cuda() != 0;
#else
    return false;
#endif
  }, "True when this extension and the core were built with CUDA.");
}

}  // namespace fp8kit_torch
