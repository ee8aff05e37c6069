// torch.ops.fp8kit.grouped_check_sizes, grouped_quantize_block,
// grouped_gemm_block_tokens and grouped_gemm_block_contract: the
// block-scaled grouped ops of the core (fp8kit/grouped.h, the padded row
// layout) as dispatcher ops of the fp8kit library, one kernel for CPU and
// CUDA each, for fp8kit.torch.GroupedLinear under BlockScaling. Fake
// kernels: fp8kit/torch/_grouped_block_fake_ops.py.
//
// Shapes: the input and every token-grouped tensor hold `rows` rows in the
// padded layout; a copy's block scales are a flat float32 tensor of
// fp8kit_grouped_block_scales_floats elements; the columnwise copy is flat
// [rows * features]; a copy not asked for comes back as an empty [0]
// tensor.
#include <torch/library.h>

#include <string>
#include <tuple>

#include "block_ops.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "grouped_args.h"

namespace fp8kit_torch {
namespace {

using BlockQuantized = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// A flat float32 scale array of `floats` elements on ref's device.
void check_scales(const char* fn, const char* arg, const at::Tensor& t, int64_t floats,
                  const at::Tensor& ref) {
  FP8KIT_TYPE_CHECK(t.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()), "; block scales are torch.float32");
  FP8KIT_VALUE_CHECK(t.dim() == 1 && t.numel() == floats, fn, ": ", arg, " has shape ",
                     shape_str(t.sizes()), " but [", floats, "] is expected (the grouped "
                     "tensor's block scales, fp8kit_grouped_block_scales_floats)");
  check_contiguous(fn, arg, t);
  check_same_device(fn, arg, t, "the data", ref);
}

fp8kit_tensor describe_fp8(const char* fn, const char* arg, const at::Tensor& t,
                           fp8kit_scaling_mode mode) {
  const fp8kit_dtype f = check_fp8(fn, arg, t);
  check_contiguous(fn, arg, t);
  fp8kit_tensor d = describe(t, f, device_type_of(t, fn, arg));
  d.scaling_mode = mode;
  return d;
}

// fp8kit_grouped_check_sizes: the counts against the real tokens, before
// the layer pads them (the padded ops cannot tell a wrong count). Returns
// a copy of the counts, for the padding to read: so it runs after the
// check, which a compiled graph then cannot drop.
at::Tensor grouped_check_sizes_op(const at::Tensor& group_sizes, int64_t tokens) {
  constexpr const char* fn = "fp8kit::grouped_check_sizes";
  check_group_sizes(fn, group_sizes, group_sizes);
  DeviceScope scope(group_sizes.device());
  const fp8kit_tensor sizes = describe_group_sizes(group_sizes);
  void* stream = group_sizes.is_cuda() ? current_stream(group_sizes.device()) : nullptr;
  check_status(call_core(!group_sizes.is_cuda(), [&] {
    return fp8kit_grouped_check_sizes(&sizes, tokens, stream);
  }));
  return group_sizes.clone();
}

BlockQuantized grouped_quantize_block_op(const at::Tensor& x_in, const at::Tensor& group_sizes,
                                    at::ScalarType fp8_dtype, const std::string& scaling_mode,
                                    bool rowwise, bool columnwise, double amax_epsilon,
                                    bool power_2_scale) {
  constexpr const char* fn = "fp8kit::grouped_quantize_block";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const std::optional<fp8kit_dtype> f = fp8_dtype_of(fp8_dtype);
  FP8KIT_TYPE_CHECK(f.has_value(), fn, ": fp8_dtype is ", dtype_str(fp8_dtype),
                    "; use torch.float8_e4m3fn or torch.float8_e5m2");
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; ask for at least one copy");
  check_amax_epsilon(fn, amax_epsilon);
  const fp8kit_scaling_mode mode = parse_block_mode(scaling_mode, fn, "scaling_mode");
  const at::Tensor x = contiguous_high_precision(fn, "x", x_in);
  FP8KIT_VALUE_CHECK(x.dim() == 2, fn, ": x has shape ", shape_str(x.sizes()),
                     "; it must be [rows, features] in the padded row layout");
  check_group_sizes(fn, group_sizes, x);
  const fp8kit_device_type dev = device_type_of(x, fn, "x");
  DeviceScope scope(x.device());
  const int64_t rows = x.size(0), features = x.size(1), groups = group_sizes.size(0);
  const auto fp8 = x.options().dtype(fp8_dtype);
  const auto f32 = x.options().dtype(at::kFloat);
  auto scales = [&](bool want, int cw) {
    return want ? at::empty({fp8kit_grouped_block_scales_floats(rows, groups, features, mode, cw)},
                            f32)
                : at::empty({0}, f32);
  };
  at::Tensor data = rowwise ? at::empty({rows, features}, fp8) : at::empty({0}, fp8);
  at::Tensor cw = columnwise ? at::empty({rows * features}, fp8) : at::empty({0}, fp8);
  at::Tensor row_scales = scales(rowwise, 0), cw_scales = scales(columnwise, 1);
  const fp8kit_tensor in = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  fp8kit_tensor out = in;
  out.dtype = *f;
  out.scaling_mode = mode;
  out.data = rowwise ? data.data_ptr() : nullptr;
  out.block_scale_inv = rowwise ? row_scales.data_ptr<float>() : nullptr;
  out.columnwise_data = columnwise ? cw.data_ptr() : nullptr;
  out.columnwise_block_scale_inv = columnwise ? cw_scales.data_ptr<float>() : nullptr;
  const fp8kit_tensor sizes = describe_group_sizes(group_sizes);
  const fp8kit_current_scaling_config config{static_cast<float>(amax_epsilon),
                                             power_2_scale ? 1 : 0};
  void* stream = current_stream(x.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_grouped_quantize_block(&in, &sizes, &out, &config, stream);
  }));
  return {data, row_scales, cw, cw_scales};
}

// Block-scaled GEMMs accumulate with split accumulation only.
at::Tensor run(fp8kit_grouped_gemm_kind kind, fp8kit_tensor& a, fp8kit_tensor& b, bool trans_b,
               at::Tensor out, const at::Tensor& group_sizes) {
  const fp8kit_device_type dev = out.device().is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
  fp8kit_tensor d = describe(out, *high_precision_dtype(out.scalar_type()), dev);
  const fp8kit_tensor sizes = describe_group_sizes(group_sizes);
  const fp8kit_grouped_gemm_config config{trans_b ? 1 : 0, nullptr, FP8KIT_BFLOAT16, 1};
  void* stream = current_stream(out.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_grouped_gemm(kind, &a, &b, &d, &sizes, &config, stream);
  }));
  return out;
}

void check_block_out_dtype(const char* fn, at::ScalarType out_dtype) {
  FP8KIT_TYPE_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kFloat, fn, ": out_dtype is ",
                    dtype_str(out_dtype), "; block-scaled GEMMs write torch.bfloat16 or "
                    "torch.float32");
}

// D [rows, N] = each group's padded rows of a [rows, K] (1x128 rowwise)
// times op(B_g): b [E, N, K] (128x128 rowwise, used as B_g^T: the forward)
// or b_columnwise [E, K, N] (its per-matrix columnwise copy, used as B_g:
// the dgrad).
at::Tensor grouped_gemm_block_tokens_op(const at::Tensor& a, const at::Tensor& a_scales,
                                        const std::optional<at::Tensor>& b,
                                        const std::optional<at::Tensor>& b_scales,
                                        const std::optional<at::Tensor>& b_columnwise,
                                        const std::optional<at::Tensor>& b_columnwise_scales,
                                        const at::Tensor& group_sizes, at::ScalarType out_dtype) {
  constexpr const char* fn = "fp8kit::grouped_gemm_block_tokens";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_block_out_dtype(fn, out_dtype);
  FP8KIT_VALUE_CHECK(a.dim() == 2, fn, ": a has shape ", shape_str(a.sizes()),
                     "; it must be [rows, K] in the padded row layout");
  FP8KIT_VALUE_CHECK(b.has_value() != b_columnwise.has_value(), fn,
                     ": pass exactly one of b (the forward) and b_columnwise (the dgrad)");
  const at::Tensor& w = b ? *b : *b_columnwise;
  const std::optional<at::Tensor>& w_scales = b ? b_scales : b_columnwise_scales;
  FP8KIT_VALUE_CHECK(w.dim() == 3 && w_scales.has_value(), fn, ": the weights must be [E, R, C] "
                     "with their block scales");
  check_group_sizes(fn, group_sizes, a);
  const int64_t groups = group_sizes.size(0), rows = a.size(0), k = a.size(1);
  FP8KIT_VALUE_CHECK(w.size(0) == groups, fn, ": the weights hold ", w.size(0),
                     " matrices but group_sizes has ", groups, " groups");
  // The logical weight [E, R, C] in both cases (the columnwise copy is
  // each matrix transposed).
  const int64_t wr = b ? w.size(1) : w.size(2), wc = b ? w.size(2) : w.size(1);
  check_scales(fn, "a_scales", a_scales,
               fp8kit_grouped_block_scales_floats(rows, groups, k, FP8KIT_SCALING_BLOCK_1X128, 0),
               a);
  check_scales(fn, b ? "b_scales" : "b_columnwise_scales", *w_scales,
               fp8kit_grouped_block_scales_floats(groups * wr, groups, wc,
                                                  FP8KIT_SCALING_BLOCK_128X128, b ? 0 : 1),
               a);
  fp8kit_tensor at = describe_fp8(fn, "a", a, FP8KIT_SCALING_BLOCK_1X128);
  at.block_scale_inv = a_scales.data_ptr<float>();
  fp8kit_tensor bt = describe_fp8(fn, b ? "b" : "b_columnwise", w, FP8KIT_SCALING_BLOCK_128X128);
  check_same_device(fn, b ? "b" : "b_columnwise", w, "a", a);
  bt.shape[1] = wr;
  bt.shape[2] = wc;
  if (b) {
    bt.block_scale_inv = w_scales->data_ptr<float>();
  } else {
    bt.columnwise_data = bt.data;
    bt.data = nullptr;
    bt.columnwise_block_scale_inv = w_scales->data_ptr<float>();
  }
  DeviceScope scope(a.device());
  at::Tensor out = at::empty({rows, b ? wr : wc}, a.options().dtype(out_dtype));
  return run(FP8KIT_GROUPED_GEMM_TOKENS, at, bt, b.has_value(), out, group_sizes);
}

// D [E, M, N] = A_g^T @ B_g over each group's padded tokens, from the
// columnwise copies (flat [rows * M], [rows * N]) of 1x128 grouped tensors.
at::Tensor grouped_gemm_block_contract_op(const at::Tensor& a_columnwise,
                                          const at::Tensor& a_scales,
                                          const at::Tensor& b_columnwise,
                                          const at::Tensor& b_scales,
                                          const at::Tensor& group_sizes, int64_t rows,
                                          at::ScalarType out_dtype) {
  constexpr const char* fn = "fp8kit::grouped_gemm_block_contract";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_block_out_dtype(fn, out_dtype);
  check_group_sizes(fn, group_sizes, a_columnwise);
  FP8KIT_VALUE_CHECK(rows > 0, fn, ": rows is ", rows, "; it must be > 0");
  const int64_t groups = group_sizes.size(0);
  int64_t features[2];
  const at::Tensor* copies[2] = {&a_columnwise, &b_columnwise};
  const at::Tensor* scales[2] = {&a_scales, &b_scales};
  const char* names[2] = {"a_columnwise", "b_columnwise"};
  const char* scale_names[2] = {"a_scales", "b_scales"};
  fp8kit_tensor ts[2];
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = *copies[i];
    FP8KIT_VALUE_CHECK(t.dim() == 1 && t.numel() > 0 && t.numel() % rows == 0, fn, ": ",
                       names[i], " has shape ", shape_str(t.sizes()), "; a columnwise copy of ",
                       rows, " padded rows is flat, rows x features elements");
    features[i] = t.numel() / rows;
    check_same_device(fn, names[i], t, "a_columnwise", a_columnwise);
    check_scales(fn, scale_names[i], *scales[i],
                 fp8kit_grouped_block_scales_floats(rows, groups, features[i],
                                                    FP8KIT_SCALING_BLOCK_1X128, 1),
                 a_columnwise);
    ts[i] = describe_fp8(fn, names[i], t, FP8KIT_SCALING_BLOCK_1X128);
    ts[i].rank = 2;
    ts[i].shape[0] = rows;
    ts[i].shape[1] = features[i];
    ts[i].columnwise_data = ts[i].data;
    ts[i].data = nullptr;
    ts[i].columnwise_block_scale_inv = scales[i]->data_ptr<float>();
  }
  DeviceScope scope(a_columnwise.device());
  at::Tensor out = at::empty({groups, features[0], features[1]},
                             a_columnwise.options().dtype(out_dtype));
  return run(FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, ts[0], ts[1], false, out, group_sizes);
}

void register_grouped_block_kernels(torch::Library& m) {
  m.impl("grouped_check_sizes", &grouped_check_sizes_op);
  m.impl("grouped_quantize_block", &grouped_quantize_block_op);
  m.impl("grouped_gemm_block_tokens", &grouped_gemm_block_tokens_op);
  m.impl("grouped_gemm_block_contract", &grouped_gemm_block_contract_op);
}

}  // namespace
}  // namespace fp8kit_torch

TORCH_LIBRARY_FRAGMENT(fp8kit, m) {
  m.def("grouped_check_sizes(Tensor group_sizes, int tokens) -> Tensor");
  m.def(
      "grouped_quantize_block(Tensor x, Tensor group_sizes, ScalarType fp8_dtype, str "
      "scaling_mode, bool rowwise, bool columnwise, float amax_epsilon=0., bool "
      "power_2_scale=True) -> (Tensor data, Tensor block_scale_inv, Tensor columnwise_data, "
      "Tensor columnwise_block_scale_inv)");
  m.def(
      "grouped_gemm_block_tokens(Tensor a, Tensor a_scales, Tensor? b, Tensor? b_scales, "
      "Tensor? b_columnwise, Tensor? b_columnwise_scales, Tensor group_sizes, ScalarType "
      "out_dtype) -> Tensor");
  m.def(
      "grouped_gemm_block_contract(Tensor a_columnwise, Tensor a_scales, Tensor b_columnwise, "
      "Tensor b_scales, Tensor group_sizes, int rows, ScalarType out_dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(fp8kit, CPU, m) { fp8kit_torch::register_grouped_block_kernels(m); }

#ifdef FP8KIT_TORCH_CUDA
TORCH_LIBRARY_IMPL(fp8kit, CUDA, m) { fp8kit_torch::register_grouped_block_kernels(m); }
#endif
