// torch.ops.fp8kit.grouped_quantize, grouped_quantize_delayed,
// grouped_gemm_tokens and grouped_gemm_contract: the grouped ops of the
// core (fp8kit/grouped.h) as
// dispatcher ops (a fragment of the fp8kit library of dispatcher_ops.cc),
// one kernel for CPU and CUDA each, for fp8kit.torch.GroupedLinear. Their
// fake kernels are in fp8kit/torch/_grouped_fake_ops.py. Like
// cast_statistics they have no pybind11 twin: one path, which
// torch.compile traces exactly as eager mode runs it.
//
// Shapes as the core lays them out: per-group scales are [E,
// GROUP_SCALE_STRIDE] float32 tensors (group g's value in column 0); the
// grouped columnwise copy of [T, F] is a flat [F * (T + 15 E)] tensor
// (fp8kit_grouped_columnwise_tokens); a copy not asked for comes back as
// an empty [0] tensor. grouped_quantize_delayed is functional, as
// torch.compile needs: it returns the updated scaling state as new tensors
// (the caller copies them into its own) rather than writing its arguments.
#include <torch/library.h>

#include <string>
#include <tuple>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "grouped_args.h"

namespace fp8kit_torch {
namespace {

using GroupedQuantized = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;


GroupedQuantized grouped_quantize_op(const at::Tensor& x_in, const at::Tensor& group_sizes,
                              at::ScalarType fp8_dtype, bool rowwise, bool columnwise,
                              const std::optional<at::Tensor>& scale, double amax_epsilon,
                              bool power_2_scale) {
  constexpr const char* fn = "fp8kit::grouped_quantize";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_amax_epsilon(fn, amax_epsilon);
  GroupedCast c = grouped_cast(fn, x_in, group_sizes, fp8_dtype, rowwise, columnwise);
  DeviceScope scope(c.x.device());
  at::Tensor scale_out;
  if (scale) {
    check_group_scales(fn, "scale", *scale, c.groups, c.x);
    scale_out = scale->clone();
  } else {
    scale_out = at::zeros_like(c.scale_inv);
  }
  c.output.scale = scale_out.data_ptr<float>();
  const fp8kit_tensor sizes = describe_group_sizes(group_sizes);
  const fp8kit_current_scaling_config current{static_cast<float>(amax_epsilon),
                                              power_2_scale ? 1 : 0};
  void* stream = current_stream(c.x.device());
  check_status(call_core(c.device == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_grouped_quantize(&c.input, &sizes, &c.output, scale ? nullptr : &current,
                                   stream);
  }));
  return {c.data, c.columnwise, scale_out, c.scale_inv, c.amax};
}

// Delayed scaling with one state per group: amax_history [E, len], scale
// and seeded [E, GROUP_SCALE_STRIDE] (group g's in column 0). Returns the
// casts (data, columnwise copy, scale_inv) and the state after the call.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
grouped_quantize_delayed_op(const at::Tensor& x_in, const at::Tensor& group_sizes,
                            at::ScalarType fp8_dtype, bool rowwise, bool columnwise,
                            const at::Tensor& amax_history, const at::Tensor& scale,
                            const at::Tensor& seeded, int64_t margin,
                            const std::string& amax_reduction, bool record) {
  constexpr const char* fn = "fp8kit::grouped_quantize_delayed";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  GroupedCast c = grouped_cast(fn, x_in, group_sizes, fp8_dtype, rowwise, columnwise);
  const at::Tensor& x = c.x;
  const int64_t groups = c.groups;
  FP8KIT_TYPE_CHECK(amax_history.scalar_type() == at::kFloat, fn, ": amax_history has dtype ",
                    dtype_str(amax_history.scalar_type()), "; the state is torch.float32");
  FP8KIT_VALUE_CHECK(amax_history.dim() == 2 && amax_history.size(0) == groups &&
                         amax_history.size(1) >= 1 &&
                         amax_history.size(1) <= FP8KIT_AMAX_HISTORY_LEN_MAX,
                     fn, ": amax_history has shape ", shape_str(amax_history.sizes()), " but [",
                     groups, ", amax_history_len] is expected, 1 <= amax_history_len <= ",
                     FP8KIT_AMAX_HISTORY_LEN_MAX);
  check_contiguous(fn, "amax_history", amax_history);
  check_same_device(fn, "amax_history", amax_history, "x", x);
  check_group_scales(fn, "scale", scale, groups, x);
  check_group_scales(fn, "seeded", seeded, groups, x);
  FP8KIT_VALUE_CHECK(margin >= 0 && margin <= FP8KIT_MARGIN_MAX, fn, ": margin is ", margin,
                     "; it must be in [0, ", FP8KIT_MARGIN_MAX, "]");
  const fp8kit_delayed_scaling_config config{
      static_cast<int>(amax_history.size(1)), static_cast<int>(margin),
      parse_amax_reduction(amax_reduction, fn, "amax_reduction")};
  DeviceScope scope(x.device());
  at::Tensor new_history = amax_history.clone(), new_scale = scale.clone(),
             new_seeded = seeded.clone();
  at::Tensor scale_used = at::zeros_like(c.scale_inv);
  c.output.scale = scale_used.data_ptr<float>();
  const fp8kit_grouped_delayed_state state{new_history.data_ptr<float>(),
                                           new_scale.data_ptr<float>(),
                                           new_seeded.data_ptr<float>()};
  const fp8kit_tensor sizes = describe_group_sizes(group_sizes);
  void* stream = current_stream(x.device());
  check_status(call_core(c.device == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_grouped_quantize_delayed_update(&c.input, &sizes, &c.output, &state, &config,
                                                  record ? 1 : 0, stream);
  }));
  return {c.data, c.columnwise, c.scale_inv, new_history, new_scale, new_seeded};
}

fp8kit_tensor describe_fp8(const char* fn, const char* arg, const at::Tensor& t,
                           fp8kit_device_type dev) {
  const fp8kit_dtype f = check_fp8(fn, arg, t);
  check_contiguous(fn, arg, t);
  fp8kit_tensor d = describe(t, f, dev);
  d.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  return d;
}

at::Tensor run_grouped_gemm(fp8kit_grouped_gemm_kind kind, fp8kit_tensor& a,
                            fp8kit_tensor& b, at::Tensor out, const at::Tensor& group_sizes,
                            const fp8kit_grouped_gemm_config& config) {
  const fp8kit_device_type dev = out.device().is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
  fp8kit_tensor d = describe(out, *high_precision_dtype(out.scalar_type()), dev);
  const fp8kit_tensor sizes = describe_group_sizes(group_sizes);
  void* stream = current_stream(out.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_grouped_gemm(kind, &a, &b, &d, &sizes, &config, stream);
  }));
  return out;
}

fp8kit_dtype check_grouped_out_dtype(const char* fn, at::ScalarType out_dtype) {
  const std::optional<fp8kit_dtype> d = high_precision_dtype(out_dtype);
  FP8KIT_TYPE_CHECK(d.has_value(), fn, ": out_dtype is ", dtype_str(out_dtype),
                    "; use torch.float32, torch.bfloat16 or torch.float16");
  return *d;
}

// D_g = A_g @ op(B_g) over token groups (fp8kit/grouped.h): a [T, K]
// rowwise; b [E, R, C] given by its rowwise data and/or its per-matrix
// columnwise copy [E, C, R].
at::Tensor grouped_gemm_tokens_op(const at::Tensor& a, const at::Tensor& a_scale_inv,
                                  const std::optional<at::Tensor>& b,
                                  const std::optional<at::Tensor>& b_columnwise,
                                  const at::Tensor& b_scale_inv, const at::Tensor& group_sizes,
                                  bool trans_b, at::ScalarType out_dtype,
                                  const std::optional<at::Tensor>& bias,
                                  bool use_split_accumulator) {
  constexpr const char* fn = "fp8kit::grouped_gemm_tokens";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_grouped_out_dtype(fn, out_dtype);
  const fp8kit_device_type dev = device_type_of(a, fn, "a");
  FP8KIT_VALUE_CHECK(a.dim() == 2, fn, ": a has shape ", shape_str(a.sizes()),
                     "; it must be [tokens, K]");
  FP8KIT_VALUE_CHECK(b || b_columnwise, fn, ": b and b_columnwise are both None; pass the "
                     "weights' copy the GEMM reads");
  const at::Tensor& b_ref = b ? *b : *b_columnwise;
  FP8KIT_VALUE_CHECK(b_ref.dim() == 3, fn, ": ", b ? "b" : "b_columnwise", " has shape ",
                     shape_str(b_ref.sizes()), "; it must be [E, R, C], one matrix per group");
  const int64_t groups = check_group_sizes(fn, group_sizes, a);
  check_group_scales(fn, "a_scale_inv", a_scale_inv, groups, a);
  check_group_scales(fn, "b_scale_inv", b_scale_inv, groups, a);
  const int64_t e = b_ref.size(0);
  const int64_t rows = b ? b->size(1) : b_columnwise->size(2);
  const int64_t cols = b ? b->size(2) : b_columnwise->size(1);
  if (b && b_columnwise) {
    FP8KIT_VALUE_CHECK(b_columnwise->sizes() == at::IntArrayRef({e, cols, rows}), fn,
                       ": b_columnwise has shape ", shape_str(b_columnwise->sizes()), " but b is ",
                       shape_str(b->sizes()), "; the columnwise copy holds each matrix "
                       "transposed, [E, C, R]");
  }
  fp8kit_tensor at = describe_fp8(fn, "a", a, dev);
  at.scale_inv = a_scale_inv.data_ptr<float>();
  fp8kit_tensor bt = describe_fp8(fn, b ? "b" : "b_columnwise", b_ref, dev);
  bt.shape[1] = rows;
  bt.shape[2] = cols;
  bt.data = b ? b->data_ptr() : nullptr;
  if (b_columnwise) {
    check_contiguous(fn, "b_columnwise", *b_columnwise);
    check_same_device(fn, "b_columnwise", *b_columnwise, "a", a);
    bt.columnwise_data = b_columnwise->data_ptr();
  }
  if (b) check_same_device(fn, "b", *b, "a", a);
  bt.scale_inv = b_scale_inv.data_ptr<float>();
  const int64_t n = trans_b ? rows : cols;
  fp8kit_grouped_gemm_config config{trans_b ? 1 : 0, nullptr, FP8KIT_BFLOAT16,
                                    use_split_accumulator ? 1 : 0};
  if (bias) {
    config.bias_dtype = check_high_precision(fn, "bias", *bias);
    FP8KIT_VALUE_CHECK(bias->sizes() == at::IntArrayRef({e, n}), fn, ": bias has shape ",
                       shape_str(bias->sizes()), " but [", e, ", ", n, "] is expected (one row "
                       "per group)");
    check_contiguous(fn, "bias", *bias);
    check_same_device(fn, "bias", *bias, "a", a);
    config.bias = bias->data_ptr();
  }
  DeviceScope scope(a.device());
  at::Tensor out = at::empty({a.size(0), n}, a.options().dtype(out_dtype));
  return run_grouped_gemm(FP8KIT_GROUPED_GEMM_TOKENS, at, bt, out, group_sizes, config);
}

// D_g = A_g^T @ B_g summed over group g's tokens, from the grouped
// columnwise copies of a [T, M] and b [T, N]; D [E, M, N].
at::Tensor grouped_gemm_contract_op(const at::Tensor& a_columnwise, const at::Tensor& a_scale_inv,
                                    const at::Tensor& b_columnwise, const at::Tensor& b_scale_inv,
                                    const at::Tensor& group_sizes, int64_t tokens,
                                    at::ScalarType out_dtype, bool use_split_accumulator) {
  constexpr const char* fn = "fp8kit::grouped_gemm_contract";
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  check_grouped_out_dtype(fn, out_dtype);
  const fp8kit_device_type dev = device_type_of(a_columnwise, fn, "a_columnwise");
  const int64_t groups = check_group_sizes(fn, group_sizes, a_columnwise);
  FP8KIT_VALUE_CHECK(tokens >= 0, fn, ": tokens is ", tokens, "; it must be >= 0");
  const int64_t capacity = fp8kit_grouped_columnwise_tokens(tokens, groups);
  int64_t features[2] = {0, 0};
  const at::Tensor* copies[2] = {&a_columnwise, &b_columnwise};
  const char* names[2] = {"a_columnwise", "b_columnwise"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = *copies[i];
    FP8KIT_VALUE_CHECK(t.dim() == 1 && t.numel() % capacity == 0 && t.numel() > 0, fn, ": ",
                       names[i], " has shape ", shape_str(t.sizes()), "; a grouped columnwise "
                       "copy of ", tokens, " tokens in ", groups, " groups is flat, features x ",
                       capacity, " elements");
    features[i] = t.numel() / capacity;
    check_same_device(fn, names[i], t, "a_columnwise", a_columnwise);
  }
  check_group_scales(fn, "a_scale_inv", a_scale_inv, groups, a_columnwise);
  check_group_scales(fn, "b_scale_inv", b_scale_inv, groups, a_columnwise);
  const int64_t a_shape[2] = {tokens, features[0]}, b_shape[2] = {tokens, features[1]};
  fp8kit_tensor at = describe_fp8(fn, "a_columnwise", a_columnwise, dev);
  at.rank = 2;
  at.shape[0] = a_shape[0];
  at.shape[1] = a_shape[1];
  at.columnwise_data = at.data;
  at.data = nullptr;
  at.scale_inv = a_scale_inv.data_ptr<float>();
  fp8kit_tensor bt = describe_fp8(fn, "b_columnwise", b_columnwise, dev);
  bt.rank = 2;
  bt.shape[0] = b_shape[0];
  bt.shape[1] = b_shape[1];
  bt.columnwise_data = bt.data;
  bt.data = nullptr;
  bt.scale_inv = b_scale_inv.data_ptr<float>();
  DeviceScope scope(a_columnwise.device());
  at::Tensor out =
      at::empty({groups, features[0], features[1]}, a_columnwise.options().dtype(out_dtype));
  const fp8kit_grouped_gemm_config config{0, nullptr, FP8KIT_BFLOAT16,
                                          use_split_accumulator ? 1 : 0};
  return run_grouped_gemm(FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, at, bt, out, group_sizes,
                          config);
}

void register_grouped_kernels(torch::Library& m) {
  m.impl("grouped_quantize", &grouped_quantize_op);
  m.impl("grouped_quantize_delayed", &grouped_quantize_delayed_op);
  m.impl("grouped_gemm_tokens", &grouped_gemm_tokens_op);
  m.impl("grouped_gemm_contract", &grouped_gemm_contract_op);
}

}  // namespace
}  // namespace fp8kit_torch

TORCH_LIBRARY_FRAGMENT(fp8kit, m) {
  m.def(
      "grouped_quantize(Tensor x, Tensor group_sizes, ScalarType fp8_dtype, bool rowwise, bool "
      "columnwise, Tensor? scale=None, float amax_epsilon=0., bool power_2_scale=False) -> "
      "(Tensor data, Tensor columnwise_data, Tensor scale, Tensor scale_inv, Tensor amax)");
  m.def(
      "grouped_quantize_delayed(Tensor x, Tensor group_sizes, ScalarType fp8_dtype, bool rowwise, "
      "bool columnwise, Tensor amax_history, Tensor scale, Tensor seeded, int margin, str "
      "amax_reduction, bool record) -> (Tensor data, Tensor columnwise_data, Tensor scale_inv, "
      "Tensor new_amax_history, Tensor new_scale, Tensor new_seeded)");
  m.def(
      "grouped_gemm_tokens(Tensor a, Tensor a_scale_inv, Tensor? b, Tensor? b_columnwise, "
      "Tensor b_scale_inv, Tensor group_sizes, bool trans_b, ScalarType out_dtype, Tensor? "
      "bias=None, bool use_split_accumulator=True) -> Tensor");
  m.def(
      "grouped_gemm_contract(Tensor a_columnwise, Tensor a_scale_inv, Tensor b_columnwise, "
      "Tensor b_scale_inv, Tensor group_sizes, int tokens, ScalarType out_dtype, bool "
      "use_split_accumulator=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(fp8kit, CPU, m) { fp8kit_torch::register_grouped_kernels(m); }

#ifdef FP8KIT_TORCH_CUDA
TORCH_LIBRARY_IMPL(fp8kit, CUDA, m) { fp8kit_torch::register_grouped_kernels(m); }
#endif
