// The block-scaled ops (block_ops.h) and their pybind11 bindings. Outputs
// are allocated through PyTorch's allocator on the input's device; CUDA
// work goes to PyTorch's current stream of that device. Every block-scale
// tensor handed in is checked against the shape the core computes for it,
// since the core reads exactly that many floats.
#include "block_ops.h"

#include <cstring>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "gemm_args.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

fp8kit_device_type core_device(const at::Device& d) {
  return d.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
}

// A descriptor carrying only what fp8kit_block_scale_inv_shape reads.
fp8kit_tensor shape_only(at::IntArrayRef shape, fp8kit_scaling_mode mode) {
  fp8kit_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.rank = static_cast<int>(shape.size());
  for (int i = 0; i < t.rank; ++i) t.shape[i] = shape[i];
  t.scaling_mode = mode;
  return t;
}

void check_copy(const char* fn, const char* arg, const at::Tensor& t, at::IntArrayRef want,
                fp8kit_dtype fp8, const char* ref_arg, const at::Tensor& ref) {
  const fp8kit_dtype f = check_fp8(fn, arg, t);
  FP8KIT_TYPE_CHECK(f == fp8, fn, ": ", arg, " holds ", fp8_name(f), " data but ", fp8_name(fp8),
                    " is expected; both copies of one tensor hold one FP8 format");
  FP8KIT_VALUE_CHECK(t.sizes() == want, fn, ": ", arg, " has shape ", shape_str(t.sizes()),
                     " but ", shape_str(want), " is expected");
  check_contiguous(fn, arg, t);
  check_same_device(fn, arg, t, ref_arg, ref);
}

// The GEMM descriptor of one operand, its device in *device.
fp8kit_tensor gemm_block_operand(const char* fn, const char* name, const BlockOperand& op,
                                 at::Device* device) {
  const std::string n = name;
  const std::string n_s = n + "_block_scale_inv", n_cw = n + "_columnwise",
                    n_cws = n + "_columnwise_block_scale_inv";
  FP8KIT_VALUE_CHECK(op.data || op.columnwise_data, fn, ": ", n, " and ", n_cw,
                     " are both None; pass the copy the GEMM reads (its K-contiguous one) with "
                     "its block scales");
  FP8KIT_VALUE_CHECK(op.data.has_value() == op.block_scale_inv.has_value(), fn, ": ", n,
                     op.data ? " is given without " : " is None but ", n_s,
                     op.data ? "" : " is given", "; each copy comes with its own block scales");
  FP8KIT_VALUE_CHECK(op.columnwise_data.has_value() == op.columnwise_block_scale_inv.has_value(),
                     fn, ": ", n_cw, op.columnwise_data ? " is given without " : " is None but ",
                     n_cws, op.columnwise_data ? "" : " is given",
                     "; each copy comes with its own block scales");
  const at::Tensor& ref = op.data ? *op.data : *op.columnwise_data;
  const char* ref_name = op.data ? name : n_cw.c_str();
  const fp8kit_dtype f = check_fp8(fn, ref_name, ref);
  const OperandShape shape =
      gemm_operand_shape(fn, name, op.data, n_cw.c_str(), op.columnwise_data);
  const int64_t logical[2] = {shape.rows, shape.cols};
  if (op.data) check_copy(fn, name, *op.data, op.data->sizes(), f, ref_name, ref);
  if (op.columnwise_data) {
    const int64_t cw[2] = {shape.cols, shape.rows};
    check_copy(fn, n_cw.c_str(), *op.columnwise_data, cw, f, ref_name, ref);
  }
  if (op.data) {
    check_block_scales(fn, n_s.c_str(), *op.block_scale_inv,
                       block_scale_inv_shape(logical, op.mode, false), ref_name, ref);
  }
  if (op.columnwise_data) {
    check_block_scales(fn, n_cws.c_str(), *op.columnwise_block_scale_inv,
                       block_scale_inv_shape(logical, op.mode, true), ref_name, ref);
  }
  device_type_of(ref, fn, ref_name);
  *device = ref.device();
  fp8kit_tensor t = gemm_operand(ref.device(), f, shape.rows, shape.cols,
                                 op.data ? op.data->data_ptr() : nullptr,
                                 op.columnwise_data ? op.columnwise_data->data_ptr() : nullptr,
                                 nullptr);
  t.scaling_mode = op.mode;
  t.block_scale_inv = op.data ? op.block_scale_inv->data_ptr<float>() : nullptr;
  t.columnwise_block_scale_inv =
      op.columnwise_data ? op.columnwise_block_scale_inv->data_ptr<float>() : nullptr;
  return t;
}

}  // namespace

void check_block_scales(const char* fn, const char* arg, const at::Tensor& s,
                        const std::vector<int64_t>& want, const char* ref_arg,
                        const at::Tensor& ref) {
  check_dense(fn, arg, s);
  FP8KIT_TYPE_CHECK(s.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(s.scalar_type()), "; block scales are torch.float32");
  FP8KIT_VALUE_CHECK(s.sizes() == at::IntArrayRef(want), fn, ": ", arg, " has shape ",
                     shape_str(s.sizes()), " but the copy it scales has block scales of shape ",
                     shape_str(want), " (fp8kit.torch.block_scale_inv_shape); pass the scales "
                     "the block quantization returned with this copy");
  check_contiguous(fn, arg, s);
  check_same_device(fn, arg, s, ref_arg, ref);
}

fp8kit_scaling_mode parse_block_mode(const std::string& name, const char* fn, const char* arg) {
  if (name == "block_1x128") return FP8KIT_SCALING_BLOCK_1X128;
  if (name == "block_128x128") return FP8KIT_SCALING_BLOCK_128X128;
  C10_THROW_ERROR(ValueError,
                  c10::str(fn, ": ", arg, " is '", name, "'; use 'block_1x128' (activations and "
                           "gradients) or 'block_128x128' (weights)"));
}

const char* block_mode_name(fp8kit_scaling_mode mode) {
  return mode == FP8KIT_SCALING_BLOCK_128X128 ? "block_128x128" : "block_1x128";
}

std::vector<int64_t> block_scale_inv_shape(at::IntArrayRef shape, fp8kit_scaling_mode mode,
                                           bool columnwise) {
  FP8KIT_VALUE_CHECK(shape.size() <= FP8KIT_MAX_RANK, "fp8kit: shape ", shape_str(shape),
                     " has more than ", FP8KIT_MAX_RANK, " dimensions");
  const fp8kit_tensor t = shape_only(shape, mode);
  int64_t out[2] = {0, 0};
  check_status(fp8kit_block_scale_inv_shape(&t, columnwise ? 1 : 0, out));
  return {out[0], out[1]};
}

BlockBuffers alloc_block_buffers(const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                                 bool rowwise, bool columnwise) {
  const auto f32 = x.options().dtype(at::kFloat);
  BlockBuffers b;
  if (rowwise) {
    b.data = alloc_rowwise(x, fp8);
    b.block_scale_inv = at::empty(block_scale_inv_shape(x.sizes(), mode, false), f32);
  }
  if (columnwise) {
    b.columnwise_data = alloc_columnwise(x, fp8);
    b.columnwise_block_scale_inv = at::empty(block_scale_inv_shape(x.sizes(), mode, true), f32);
  }
  return b;
}

void check_block_buffers(const char* fn, const BlockBuffers& b, at::IntArrayRef shape,
                         fp8kit_dtype fp8, fp8kit_scaling_mode mode, const at::Tensor& x) {
  FP8KIT_VALUE_CHECK(b.data.defined() || b.columnwise_data.defined(), fn,
                     ": dst holds no FP8 data");
  if (b.data.defined()) {
    check_copy(fn, "dst._data", b.data, shape, fp8, "src", x);
    check_block_scales(fn, "dst._block_scale_inv", b.block_scale_inv,
                       block_scale_inv_shape(shape, mode, false), "src", x);
  }
  if (b.columnwise_data.defined()) {
    check_copy(fn, "dst._columnwise_data", b.columnwise_data, columnwise_shape(shape), fp8,
               "src", x);
    check_block_scales(fn, "dst._columnwise_block_scale_inv", b.columnwise_block_scale_inv,
                       block_scale_inv_shape(shape, mode, true), "src", x);
  }
}

void quantize_block_into(const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                         const BlockBuffers& out_buffers, double amax_epsilon,
                         bool power_2_scale) {
  FP8KIT_PROFILE_SCOPE("fp8kit::quantize_block_scaling");
  const fp8kit_device_type dev = core_device(x.device());
  const fp8kit_tensor in = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  fp8kit_tensor out = in;
  out.dtype = fp8;
  out.scaling_mode = mode;
  const BlockBuffers& b = out_buffers;
  out.data = b.data.defined() ? b.data.data_ptr() : nullptr;
  out.block_scale_inv = b.data.defined() ? b.block_scale_inv.data_ptr<float>() : nullptr;
  out.columnwise_data = b.columnwise_data.defined() ? b.columnwise_data.data_ptr() : nullptr;
  out.columnwise_block_scale_inv =
      b.columnwise_data.defined() ? b.columnwise_block_scale_inv.data_ptr<float>() : nullptr;
  fp8kit_current_scaling_config cfg;
  cfg.amax_epsilon = static_cast<float>(amax_epsilon);
  cfg.power_2_scale = power_2_scale ? 1 : 0;
  void* stream = current_stream(x.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_quantize_block_scaling(&in, &out, &cfg, stream);
  }));
}

std::tuple<OptTensor, OptTensor, OptTensor, OptTensor> quantize_block(
    const char* fn, const at::Tensor& x_in, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
    bool rowwise, bool columnwise, double amax_epsilon, bool power_2_scale) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; ask for at least one copy");
  check_amax_epsilon(fn, amax_epsilon);
  const at::Tensor x = contiguous_high_precision(fn, "x", x_in);
  DeviceScope scope(x.device());
  const BlockBuffers b = alloc_block_buffers(x, fp8, mode, rowwise, columnwise);
  quantize_block_into(x, fp8, mode, b, amax_epsilon, power_2_scale);
  auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; };
  return {opt(b.data), opt(b.block_scale_inv), opt(b.columnwise_data),
          opt(b.columnwise_block_scale_inv)};
}

at::Tensor dequantize_block(const char* fn, const at::Tensor& data_in,
                            const at::Tensor& block_scale_inv, fp8kit_scaling_mode mode,
                            at::ScalarType out_dtype, bool from_columnwise,
                            const std::optional<std::vector<int64_t>>& shape) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const fp8kit_dtype f = check_fp8(fn, "data", data_in);
  const fp8kit_device_type dev = device_type_of(data_in, fn, "data");
  FP8KIT_TYPE_CHECK(high_precision_dtype(out_dtype).has_value(), fn, ": out_dtype is ",
                    dtype_str(out_dtype),
                    "; use torch.float32, torch.bfloat16 or torch.float16");
  check_contiguous(fn, "data", data_in);
  const std::vector<int64_t> logical =
      dequantized_shape(fn, data_in, from_columnwise, shape);
  check_block_scales(fn, "block_scale_inv", block_scale_inv,
                     block_scale_inv_shape(logical, mode, from_columnwise), "data", data_in);
  DeviceScope scope(data_in.device());
  at::Tensor out = at::empty(logical, data_in.options().dtype(out_dtype));
  fp8kit_tensor in = describe(out, f, dev);
  in.scaling_mode = mode;
  if (from_columnwise) {
    in.data = nullptr;
    in.columnwise_data = data_in.data_ptr();
    in.columnwise_block_scale_inv = block_scale_inv.data_ptr<float>();
  } else {
    in.data = data_in.data_ptr();
    in.block_scale_inv = block_scale_inv.data_ptr<float>();
  }
  fp8kit_tensor o = describe(out, *high_precision_dtype(out_dtype), dev);
  FP8KIT_PROFILE_SCOPE("fp8kit::dequantize");
  void* stream = current_stream(data_in.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_dequantize(&in, &o, from_columnwise ? 1 : 0, stream);
  }));
  return out;
}

at::Tensor gemm_block(const char* fn, const BlockOperand& a, const BlockOperand& b, bool trans_a,
                      bool trans_b, at::ScalarType out_dtype, const OptTensor& bias,
                      bool accumulate, const OptTensor& out) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Device dev_a(at::kCPU), dev_b(at::kCPU);
  const fp8kit_tensor da = gemm_block_operand(fn, "a", a, &dev_a);
  const fp8kit_tensor db = gemm_block_operand(fn, "b", b, &dev_b);
  const GemmShape shape = gemm_shape(fn, da, dev_a, db, dev_b, trans_a, trans_b);
  const at::Device device = dev_a;
  const at::Tensor& ref_a = a.data ? *a.data : *a.columnwise_data;  // the tensor "a" in messages
  FP8KIT_TYPE_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kFloat, fn, ": out_dtype is ",
                    dtype_str(out_dtype), "; a block-scaled FP8 GEMM writes torch.bfloat16 or "
                    "torch.float32 (cast a float32 result to torch.float16 if you need it)");
  const at::Tensor d = gemm_output(fn, out, out_dtype, shape, accumulate, "a", ref_a);
  fp8kit_tensor dt = describe(d, *high_precision_dtype(out_dtype), da.device_type);
  // Split accumulation is the only mode of the block-scaled kernels.
  fp8kit_gemm_config cfg =
      gemm_config(trans_a, trans_b, accumulate, /*use_split_accumulator=*/true);
  at::Tensor bias_c;
  if (bias) {
    const bool bf16 = bias->scalar_type() == at::kBFloat16;
    bias_c = set_gemm_bias(fn, *bias, bf16 ? std::optional(FP8KIT_BFLOAT16) : std::nullopt,
                           "the GEMM's bias epilogue takes a torch.bfloat16 bias (add another "
                           "bias to the result instead)",
                           shape.n, "a", ref_a, &cfg);
    cfg.epilogue = FP8KIT_EPILOGUE_BIAS;
  }
  DeviceScope scope(device);
  gemm_call(da, db, dt, cfg, device);
  return d;
}

bool supports_block_scaled_fp8_gemm(const char* fn, const at::Device& device_in) {
  const at::Device device = capability_query_device(fn, device_in);
  int supported = 0;
  check_status(fp8kit_supports_block_scaled_fp8_gemm(
      core_device(device), device.is_cuda() ? device.index() : 0, &supported));
  return supported != 0;
}

void register_block_ops(py::module_& m) {
  m.attr("BLOCK_LEN") = FP8KIT_BLOCK_LEN;
  m.def(
      "block_scale_inv_shape",
      [](const std::vector<int64_t>& shape, const std::string& scaling_mode, bool columnwise) {
        constexpr const char* fn = "fp8kit.torch.block_scale_inv_shape";
        const auto s = block_scale_inv_shape(
            shape, parse_block_mode(scaling_mode, fn, "scaling_mode"), columnwise);
        return py::make_tuple(s[0], s[1]);
      },
      py::arg("shape"), py::arg("scaling_mode"), py::arg("columnwise") = false,
      "(outer, inner) of the block scales of the rowwise (or columnwise) copy of a tensor of "
      "`shape` (common/include/fp8kit/block_scaling.h).");
  m.def(
      "quantize_block",
      [](const at::Tensor& x, const std::string& fp8_dtype, const std::string& scaling_mode,
         bool rowwise, bool columnwise, double amax_epsilon, bool power_2_scale) {
        constexpr const char* fn = "fp8kit.torch.quantize_block";
        return quantize_block(fn, x, parse_fp8_name(fp8_dtype, fn, "fp8_dtype"),
                              parse_block_mode(scaling_mode, fn, "scaling_mode"), rowwise,
                              columnwise, amax_epsilon, power_2_scale);
      },
      py::arg("x"), py::arg("fp8_dtype"), py::arg("scaling_mode"), py::arg("rowwise") = true,
      py::arg("columnwise") = false, py::arg("amax_epsilon") = 0.0,
      py::arg("power_2_scale") = true,
      "Block-scaled quantization: returns (data, block_scale_inv, columnwise_data, "
      "columnwise_block_scale_inv), None for a copy not asked for.");
  m.def(
      "dequantize_block",
      [](const at::Tensor& data, const at::Tensor& block_scale_inv,
         const std::string& scaling_mode, at::ScalarType out_dtype, bool from_columnwise,
         const std::optional<std::vector<int64_t>>& shape) {
        constexpr const char* fn = "fp8kit.torch.dequantize_block";
        return dequantize_block(fn, data, block_scale_inv,
                                parse_block_mode(scaling_mode, fn, "scaling_mode"), out_dtype,
                                from_columnwise, shape);
      },
      py::arg("data"), py::arg("block_scale_inv"), py::arg("scaling_mode"),
      py::arg("out_dtype"), py::arg("from_columnwise") = false, py::arg("shape") = py::none(),
      "Each element times its block's scale_inv, in out_dtype; from_columnwise reads the "
      "[last, prod(leading)] copy and returns `shape` (default: the 2-D transpose).");
  m.def(
      "gemm_block",
      [](const OptTensor& a, const OptTensor& a_block_scale_inv, const OptTensor& a_columnwise,
         const OptTensor& a_columnwise_block_scale_inv, const std::string& a_scaling_mode,
         const OptTensor& b, const OptTensor& b_block_scale_inv, const OptTensor& b_columnwise,
         const OptTensor& b_columnwise_block_scale_inv, const std::string& b_scaling_mode,
         bool trans_a, bool trans_b, at::ScalarType out_dtype, const OptTensor& bias,
         bool accumulate, const OptTensor& out) {
        constexpr const char* fn = "fp8kit.torch.gemm_block";
        const BlockOperand oa{a, a_block_scale_inv, a_columnwise, a_columnwise_block_scale_inv,
                              parse_block_mode(a_scaling_mode, fn, "a_scaling_mode")};
        const BlockOperand ob{b, b_block_scale_inv, b_columnwise, b_columnwise_block_scale_inv,
                              parse_block_mode(b_scaling_mode, fn, "b_scaling_mode")};
        return gemm_block(fn, oa, ob, trans_a, trans_b, out_dtype, bias, accumulate, out);
      },
      py::arg("a"), py::arg("a_block_scale_inv"), py::arg("a_columnwise"),
      py::arg("a_columnwise_block_scale_inv"), py::arg("a_scaling_mode"), py::arg("b"),
      py::arg("b_block_scale_inv"), py::arg("b_columnwise"),
      py::arg("b_columnwise_block_scale_inv"), py::arg("b_scaling_mode"),
      py::arg("trans_a") = false, py::arg("trans_b") = false,
      py::arg("out_dtype") = at::kBFloat16, py::arg("bias") = py::none(),
      py::arg("accumulate") = false, py::arg("out") = py::none(),
      "D = op(a) @ op(b) with every element dequantized by its block's scale_inv (+ bias) "
      "(+ out's old contents with accumulate); see common/include/fp8kit/gemm.h.");
  m.def(
      "supports_block_scaled_fp8_gemm",
      [](py::handle device) {
        constexpr const char* fn = "fp8kit.torch.supports_block_scaled_fp8_gemm";
        return supports_block_scaled_fp8_gemm(fn, read_device(device, c10::str(fn, ": device")));
      },
      py::arg("device"),
      "Whether `device` runs block-scaled FP8 GEMMs (the core's cached answer: Hopper with "
      "cuBLASLt 12.9+, and the CPU reference).");
}

}  // namespace fp8kit_torch
