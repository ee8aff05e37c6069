// The FP8 Linear's forward: quantize the input and the weight (or reuse the
// cached FP8 weight), the FP8 GEMM with the bias epilogue, and, when a
// gradient is wanted, the autograd node with the FP8 copies backward reads.
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/autocast_mode.h>

#include "carve.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "linear_autograd.h"
#include "node_maker.h"

namespace fp8kit_torch {
namespace {

constexpr const char* kLinearFn = "fp8kit.torch.Linear";

std::vector<int64_t> out_sizes(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> s = x.sizes().vec();
  s.back() = n;
  return s;
}

// The copy `keep` names (at most one of each tensor is kept), or none.
at::Tensor kept_copy(fp8kit_copies keep, const at::Tensor& rowwise,
                     const at::Tensor& columnwise) {
  if (keep.rowwise) return rowwise;
  if (keep.columnwise) return columnwise;
  return at::Tensor();
}

// y[M, N] = x[M, K] @ w[N, K]^T (+ bias): both operands K-contiguous,
// the rowwise copies every plan writes for x and an [N, K] weight. y has
// the layer's dtype (`options`', the weight's) and `sizes`.
at::Tensor forward_gemm(const LinearState& st, const at::Tensor& x_data,
                        const ScaleInv& x_scale_inv, const at::Tensor& w_data,
                        const ScaleInv& w_scale_inv, const at::Tensor& b, const LinearCall& p,
                        const std::vector<int64_t>& sizes, const at::TensorOptions& options) {
  const at::ScalarType out_dtype = options.dtype().toScalarType();
  at::Tensor y = at::empty(sizes, options);
  const fp8kit_dtype fwd = st.recipe.forward_dtype;
  const fp8kit_tensor a = gemm_operand(st.device, fwd, p.m, p.k, x_data.data_ptr(), nullptr,
                                       x_scale_inv.ptr());
  const fp8kit_tensor bw = gemm_operand(st.device, fwd, p.n, p.k, w_data.data_ptr(), nullptr,
                                        w_scale_inv.ptr());
  fp8kit_tensor d = describe(y, *high_precision_dtype(out_dtype),
                             st.device.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU);
  fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
  cfg.trans_a = 0;
  cfg.trans_b = 1;
  // The recipe's forward_fast_accumulation (fp8kit/recipe.py says why it
  // is off by default); the gradient GEMMs always promote.
  cfg.use_split_accumulator = p.fast_accumulation ? 0 : 1;
  // The bias epilogue takes a bias in D's dtype (bf16 for an fp32 D, which
  // would round an fp32 bias): fp32 outputs add the bias separately.
  const bool fused_bias = b.defined() && out_dtype != at::kFloat;
  at::Tensor bias_c;
  if (fused_bias) {
    bias_c = b.contiguous();  // b has out_dtype (checked: the layer's dtype)
    if (reinterpret_cast<uintptr_t>(bias_c.data_ptr()) % 16 != 0) {
      bias_c = bias_c.clone();  // an offset view: the epilogue reads 16-byte aligned bias
    }
    cfg.epilogue = FP8KIT_EPILOGUE_BIAS;
    cfg.bias = bias_c.data_ptr();
    cfg.bias_dtype = *high_precision_dtype(out_dtype);
    cfg.bias_numel = p.n;
  }
  if (p.m > 0) gemm_call(a, bw, d, cfg, st.device);
  if (b.defined() && !fused_bias) y.add_(b);
  return y;
}

}  // namespace

// saved == nullptr: a forward that computes no gradient (casts with the
// current scales and records nothing). given != nullptr: the weight is
// already FP8. cast_x != nullptr: the input is already FP8.
at::Tensor linear_forward_below_autograd(LinearState& st, const at::Tensor& x_in,
                                         const at::Tensor& w_in, const at::Tensor& b,
                                         const LinearCall& p, LinearSaved* saved,
                                         const FP8Weight* given, const CastInput* cast_x) {
  const at::Tensor x = cast_x != nullptr || !x_in.defined() ? x_in : x_in.contiguous();
  const fp8kit_linear_plan& plan = p.plan;
  const bool cast_x_here = cast_x == nullptr;
  const fp8kit_copies x_cast = cast_x_here ? plan.quantize[kInput] : fp8kit_copies{0, 0};
  const fp8kit_copies w_cast = plan.quantize[kWeight];
  const bool save = saved != nullptr;
  const fp8kit_copies x_keep = save ? plan.saved_input : fp8kit_copies{0, 0};
  const fp8kit_copies w_keep = save ? plan.saved_weight : fp8kit_copies{0, 0};
  at::Tensor x_data, x_columnwise, w, w_data, w_columnwise;
  ScaleInv x_scale_inv, w_scale_inv;
  {
    const auto lock = lock_state(st.mu);
    const bool requant = given == nullptr && !st.weight_cached(w_in, w_cast);
    // The cache keeps the weight's pieces across calls: their own buffer.
    const bool cache_w = requant && st.cache_weight && !w_in.is_inference();
    if (requant) {
      st.clear_weight_cache();
      w = w_in.contiguous();
    }
    // Every FP8 buffer and scalars block of this call, carved by lifetime:
    // kept for backward, kept by the weight cache, or used only here.
    const at::ScalarType fp8 = torch_fp8_type(st.recipe.forward_dtype);
    const std::vector<int64_t> x_cw =
        x_cast.columnwise ? columnwise_shape(x.sizes()) : std::vector<int64_t>();
    const bool w_columnwise_cast = requant && w_cast.columnwise;
    const std::vector<int64_t> w_cw =
        w_columnwise_cast ? columnwise_shape(w.sizes()) : std::vector<int64_t>();
    const int64_t scalars_shape[1] = {kScalars};
    // Lifetimes. The saved pieces share one buffer, or with
    // saved->own_buffers get one each (kOwnBuffer + the piece's index).
    enum { kUsedHere, kSaved, kCached, kOwnBuffer };
    const bool own = save && saved->own_buffers;
    auto kept_life = [&](bool kept, int piece) {
      return !kept ? kUsedHere : own ? kOwnBuffer + piece : kSaved;
    };
    auto w_life = [&](bool kept, int piece) {
      return cache_w ? kCached : kept_life(kept, piece);
    };
    const Piece pieces[6] = {
        {x_cast.rowwise != 0, fp8, cast_x_here ? x.sizes() : at::IntArrayRef(),
         kept_life(x_keep.rowwise != 0, 0)},
        {x_cast.columnwise != 0, fp8, x_cw, kept_life(x_keep.columnwise != 0, 1)},
        {cast_x_here, at::kFloat, scalars_shape, kept_life(save, 2)},
        {requant && w_cast.rowwise, fp8, requant ? w.sizes() : at::IntArrayRef(),
         w_life(w_keep.rowwise != 0, 3)},
        {w_columnwise_cast, fp8, w_cw, w_life(w_keep.columnwise != 0, 4)},
        {requant, at::kFloat, scalars_shape, w_life(save, 5)}};
    at::Tensor t[6];
    carve(w_in.device(), pieces, 6, t);
    if (own) {
      // Outputs of a dispatcher op: no uninitialised floats between the
      // scalars the quantization writes (the scalars block's padding, and
      // the scale and amax that delayed scaling keeps in the state).
      if (t[2].defined()) t[2].zero_();
      if (t[5].defined()) t[5].zero_();
    }
    SlotJob jobs[2];
    int n = 0;
    if (requant) {
      w_data = t[3];
      w_columnwise = t[4];
      w_scale_inv = ScaleInv{t[5], true};
      jobs[n++] = SlotJob{kWeight, &w, w_data, w_columnwise, t[5].data_ptr<float>()};
      if (cache_w) st.keep_weight(w_in, w_data, w_columnwise, t[5]);
    } else if (given != nullptr) {
      w_data = given->data;
      w_columnwise = given->columnwise_data;
      w_scale_inv = ScaleInv{given->scale_inv, false};
    } else {
      w_data = st.w_data;
      w_columnwise = st.w_columnwise;
      w_scale_inv = ScaleInv{st.w_scalars, true};
    }
    if (cast_x_here) {
      x_data = t[0];
      x_columnwise = t[1];
      x_scale_inv = ScaleInv{t[2], true};
      jobs[n++] = SlotJob{kInput, &x, x_data, x_columnwise, t[2].data_ptr<float>()};
    } else {
      x_data = cast_x->data;
      x_columnwise = cast_x->columnwise_data;
      x_scale_inv = ScaleInv{cast_x->scale_inv, false};
    }
    if (n > 0) st.quantize_slots(jobs, n, /*record=*/save);
  }
  if (p.statistics.defined()) {  // an inspected call; the GEMM reads both rowwise copies
    const fp8kit_dtype fwd = st.recipe.forward_dtype;
    const at::Tensor& x_values = cast_x_here ? x : cast_x->values;
    if (x_values.defined()) {
      record_statistics(p.statistics, kInput, x_values, fwd, x_data, false,
                        x_scale_inv.tensor());
    }
    if (given == nullptr) {  // a weight already in FP8 has no high-precision copy here
      record_statistics(p.statistics, kWeight, w.defined() ? w : w_in.contiguous(), fwd, w_data,
                        false, w_scale_inv.tensor());
    }
  }
  at::Tensor y = forward_gemm(st, x_data, x_scale_inv, w_data, w_scale_inv, b, p,
                              cast_x_here ? out_sizes(x, p.n) : std::vector<int64_t>{p.m, p.n},
                              w_in.options().dtype(p.out_dtype));
  if (saved) {
    saved->x_q = kept_copy(x_keep, x_data, x_columnwise);
    saved->x_scale_inv = x_scale_inv.tensor();
    saved->w_q = kept_copy(w_keep, w_data, w_columnwise);
    saved->w_scale_inv = w_scale_inv.tensor();
  }
  return y;
}

namespace {

// Forward with autograd: the FP8 forward below autograd, then the node.
at::Tensor forward_with_grad(LinearState& st, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& b, const LinearCall& p, const FP8Weight* given) {
  LinearSaved saved;
  at::Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    y = linear_forward_below_autograd(st, x, w, b, p, &saved, given);
  }
  auto node = NodeMaker<LinearBackward>::make();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  node->info.st = c10::intrusive_ptr<LinearState>::reclaim_copy(&st);
  node->info.call = p;
  node->info.x_sizes = x.sizes().vec();
  node->info.x_dtype = x.scalar_type();
  node->info.w_dtype = w.scalar_type();
  node->info.b_dtype = b.defined() ? b.scalar_type() : at::kFloat;
  node->x_q = torch::autograd::SavedVariable(saved.x_q, /*is_output=*/false);
  node->x_scale_inv = torch::autograd::SavedVariable(saved.x_scale_inv, false);
  node->w_q = torch::autograd::SavedVariable(saved.w_q, false);
  node->w_scale_inv = torch::autograd::SavedVariable(saved.w_scale_inv, false);
  torch::autograd::set_history(y, NodePtr(node));
  return y;
}

// `fw` checked against the weight `w` stands for and the copies `plan`
// reads (errors name `fn`), with a scale_inv of its own.
FP8Weight checked_fp8_weight(const char* fn, const LinearState& st, const FP8Weight& fw,
                             const at::Tensor& w, const fp8kit_linear_plan& plan) {
  const at::ScalarType fp8 = torch_fp8_type(st.recipe.forward_dtype);
  const int64_t n = w.size(0), k = w.size(1);
  auto check_copy = [&](const at::Tensor& t, const char* arg, int64_t rows, int64_t cols,
                        bool needed, const char* fix) {
    if (!t.defined()) {
      FP8KIT_VALUE_CHECK(!needed, fn, ": the FP8 weight has no ", arg, ", which this call's ",
                         "GEMMs read on ", device_str(st.device), "; ", fix);
      return;
    }
    check_dense(fn, arg, t);
    FP8KIT_TYPE_CHECK(t.scalar_type() == fp8, fn, ": the FP8 weight's ", arg, " is ",
                      dtype_str(t.scalar_type()), " but the recipe's forward format is ",
                      dtype_str(fp8), "; cast the weight with the recipe's forward format");
    FP8KIT_VALUE_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, fn,
                       ": the FP8 weight's ", arg, " has shape ", shape_str(t.sizes()),
                       " but a weight of shape ", shape_str(w.sizes()), " needs [", rows, ", ",
                       cols, "]");
    check_contiguous(fn, arg, t);
    check_same_device(fn, arg, t, "weight", w);
  };
  const fp8kit_copies need = plan.quantize[kWeight];
  check_copy(fw.data, "rowwise data", n, k, need.rowwise != 0,
             "make it with weight.update_usage(rowwise=True)");
  check_copy(fw.columnwise_data, "columnwise data", k, n, need.columnwise != 0,
             "make it with weight.update_usage(columnwise=True)");
  check_f32_scalar(fn, "the FP8 weight's scale_inv", fw.scale_inv, "weight", w);
  // A copy of scale_inv: FSDP2 rewrites the gathered weight's in place
  // (with the same value) when it gathers the weight again for backward.
  return FP8Weight{fw.data, fw.columnwise_data, fw.scale_inv.reshape({1}).clone()};
}

}  // namespace

const FP8Weight* check_forward_extras(const char* fn, const LinearState& st,
                                      const at::Tensor& w, const at::Tensor& statistics,
                                      const FP8Weight* fp8_weight, LinearCall* p,
                                      FP8Weight* given) {
  if (statistics.defined()) {
    check_statistics(fn, statistics, st.device);
    p->statistics = statistics;
  }
  if (fp8_weight == nullptr) return nullptr;
  *given = checked_fp8_weight(fn, st, *fp8_weight, w, p->plan);
  return given;
}

void check_statistics(const char* fn, const at::Tensor& statistics, const at::Device& device) {
  if (!statistics.defined()) return;
  FP8KIT_VALUE_CHECK(statistics.scalar_type() == at::kFloat && statistics.dim() == 2 &&
                         statistics.size(0) == kSlots && statistics.size(1) == kStatColumns &&
                         statistics.is_contiguous() && statistics.device() == device,
                     fn, ": statistics is ", dtype_str(statistics.scalar_type()), " of shape ",
                     shape_str(statistics.sizes()), " on ", device_str(statistics.device()),
                     "; it must be a contiguous float32 [", kSlots, ", ", kStatColumns,
                     "] tensor on the layer's device (", device_str(device), ")");
}

void record_statistics(const at::Tensor& statistics, int slot, const at::Tensor& x,
                       fp8kit_dtype fp8, const at::Tensor& data, bool from_columnwise,
                       const at::Tensor& scales, fp8kit_scaling_mode mode) {
  const at::Tensor row = statistics.select(0, slot);
  float* r = row.data_ptr<float>();
  const fp8kit_cast_statistics out{r + kStatAmax,
                                   reinterpret_cast<unsigned int*>(r + kStatUnderflow),
                                   reinterpret_cast<unsigned int*>(r + kStatSaturated),
                                   r + kStatErrorSq, r + kStatNormSq,
                                   /*workspace: cast_statistics_into's*/ nullptr};
  cast_statistics_into(x, fp8, mode, data, from_columnwise, scales.data_ptr<float>(), out);
  at::Tensor scale_inv = row.narrow(0, kStatScaleInv, 1);
  if (mode == FP8KIT_SCALING_PER_TENSOR) {
    scale_inv.copy_(scales.reshape({1}));
  } else {
    scale_inv.fill_(std::nanf(""));
  }
  row.narrow(0, kStatRecorded, 1).fill_(1.0);
}

fp8kit_linear_plan linear_plan(const LinearCall& call) {
  fp8kit_linear_plan plan;
  check_status(fp8kit_linear_plan_make(call.m, call.k, call.n, FP8KIT_WEIGHT_OUT_IN,
                                       call.dgrad ? 1 : 0, call.wgrad ? 1 : 0,
                                       call.non_tn ? 1 : 0, &plan));
  return plan;
}

LinearCall linear_call(const char* fn, const LinearState& st, const at::Tensor& x,
                       const at::Tensor& w, const at::Tensor& b, bool dgrad, bool wgrad,
                       bool bgrad, bool fast_accumulation, bool x_cast,
                       std::optional<at::ScalarType> cast_out_dtype, bool master_weight) {
  check_high_precision(fn, "weight", w);
  at::ScalarType out_dtype = w.scalar_type();
  if (x_cast) {
    if (cast_out_dtype) {
      FP8KIT_TYPE_CHECK(high_precision_dtype(*cast_out_dtype).has_value(), fn, ": out_dtype is ",
                        dtype_str(*cast_out_dtype), "; use float32, bfloat16 or float16");
      out_dtype = *cast_out_dtype;
    }
    check_dense(fn, "input", x);
    const fp8kit_dtype fmt = check_fp8(fn, "input", x);
    FP8KIT_TYPE_CHECK(fmt == st.recipe.forward_dtype, fn, ": the cast input is ",
                      dtype_str(x.scalar_type()), " but the recipe's forward format is ",
                      dtype_str(torch_fp8_type(st.recipe.forward_dtype)),
                      "; cast it with the state's input slot");
    FP8KIT_VALUE_CHECK(x.dim() == 2, fn, ": the cast input has shape ", shape_str(x.sizes()),
                       "; it must be [tokens, in_features]");
    check_contiguous(fn, "input", x);
  } else {
    check_high_precision(fn, "input", x);
    // torch.nn.Linear's rule (and its exception type, RuntimeError): one
    // dtype for input, weight and bias; but for FP8 a float32 weight beside
    // a bf16 / fp16 input is cast to FP8 as it is (master weights under
    // torch.autocast: one rounding, and no bf16 copy of the weight).
    const bool mixed = master_weight && w.scalar_type() == at::kFloat &&
                       (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
    TORCH_CHECK(x.scalar_type() == w.scalar_type() || mixed, fn, ": input has dtype ",
                dtype_str(x.scalar_type()), " but weight has dtype ", dtype_str(w.scalar_type()),
                "; as in torch.nn.Linear they must match: convert the input (input.to(",
                dtype_str(w.scalar_type()), ")) or the layer (layer.to(",
                dtype_str(x.scalar_type()), ")), or run under torch.autocast");
    out_dtype = x.scalar_type();
  }
  FP8KIT_VALUE_CHECK(w.dim() == 2, fn, ": weight has shape ", shape_str(w.sizes()),
                     "; it must be [out_features, in_features]");
  const int64_t n = w.size(0), k = w.size(1);
  FP8KIT_VALUE_CHECK(n > 0 && k > 0, fn, ": weight has shape ", shape_str(w.sizes()),
                     "; an FP8 Linear needs in_features > 0 and out_features > 0");
  FP8KIT_VALUE_CHECK(x.dim() >= 1 && x.size(-1) == k, fn, ": input has shape ",
                     shape_str(x.sizes()), " but in_features is ", k,
                     "; the last dimension of input must equal in_features");
  check_rank(fn, "input", x);
  check_same_device(fn, "input", x, "weight", w);
  FP8KIT_VALUE_CHECK(st.device == w.device(), fn, ": the layer's FP8 scaling state is on ",
                     device_str(st.device), " but weight is on ", device_str(w.device()),
                     "; move the whole module with .to(device)");
  device_type_of(x, fn, "input");
  FP8KIT_VALUE_CHECK(k % FP8KIT_GEMM_DIM_MULTIPLE == 0, fn, ": in_features is ", k,
                     " but the FP8 GEMM needs in_features to be a multiple of ",
                     FP8KIT_GEMM_DIM_MULTIPLE,
                     " (cuBLASLt's K alignment); pad the layer or run it outside "
                     "fp8kit.torch.autocast");
  FP8KIT_VALUE_CHECK(n % FP8KIT_GEMM_DIM_MULTIPLE == 0, fn, ": out_features is ", n,
                     " but the FP8 backward GEMM needs out_features to be a multiple of ",
                     FP8KIT_GEMM_DIM_MULTIPLE,
                     " (cuBLASLt's K alignment for dgrad); pad the layer or run it outside "
                     "fp8kit.torch.autocast");
  if (b.defined()) {
    check_high_precision(fn, "bias", b);
    if (out_dtype == w.scalar_type()) {
      TORCH_CHECK(b.scalar_type() == w.scalar_type(), fn, ": bias has dtype ",
                  dtype_str(b.scalar_type()), " but weight has dtype ", dtype_str(w.scalar_type()),
                  "; as in torch.nn.Linear they must match (convert the layer with "
                  "layer.to(dtype))");
    } else {
      TORCH_CHECK(b.scalar_type() == out_dtype, fn, ": bias has dtype ",
                  dtype_str(b.scalar_type()), " but the output has dtype ", dtype_str(out_dtype),
                  "; beside a float32 weight the bias has the output's dtype (as "
                  "torch.autocast casts it): convert it with bias.to(", dtype_str(out_dtype), ")");
    }
    FP8KIT_VALUE_CHECK(b.dim() == 1 && b.size(0) == n, fn, ": bias has shape ",
                       shape_str(b.sizes()), " but out_features is ", n);
    check_same_device(fn, "bias", b, "weight", w);
  }
  LinearCall p;
  p.k = k;
  p.n = n;
  p.m = x.numel() / k;
  p.dgrad = dgrad;
  p.wgrad = wgrad;
  p.bgrad = bgrad && b.defined();
  p.non_tn = st.non_tn;
  p.fast_accumulation = fast_accumulation;
  p.out_dtype = out_dtype;
  p.plan = linear_plan(p);
  return p;
}

at::Tensor linear_forward(LinearState& st, const at::Tensor& x, const at::Tensor& w,
                          const std::optional<at::Tensor>& bias, bool fast_accumulation,
                          const FP8Weight* fp8_weight, const at::Tensor& statistics) {
  FP8KIT_PROFILE_SCOPE("fp8kit::linear_forward");
  const at::Tensor b = bias && bias->defined() ? *bias : at::Tensor();
  const bool grad = at::GradMode::is_enabled();
  // Outside torch.autocast the dtypes match as torch.nn.Linear's must; under
  // it fp8kit.torch.Linear passes a float32 weight as it is (linear.py).
  const bool master_weight = x.scalar_type() != w.scalar_type() &&
                             (x.device().is_cpu() || x.device().is_cuda()) &&
                             at::autocast::is_autocast_enabled(x.device().type());
  LinearCall p =
      linear_call(kLinearFn, st, x, w, b, grad && x.requires_grad(), grad && w.requires_grad(),
                  grad && b.defined() && b.requires_grad(), fast_accumulation, /*x_cast=*/false,
                  std::nullopt, master_weight);
  DeviceScope scope(st.device);
  FP8Weight given;
  const FP8Weight* given_ptr =
      check_forward_extras(kLinearFn, st, w, statistics, fp8_weight, &p, &given);
  if (!p.dgrad && !p.wgrad && !p.bgrad) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return linear_forward_below_autograd(st, x, w, b, p, nullptr, given_ptr);
  }
  return forward_with_grad(st, x, w, b, p, given_ptr);
}

}  // namespace fp8kit_torch
