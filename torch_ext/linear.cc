#include "linear.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "carve.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"

namespace py = pybind11;
using torch::autograd::variable_list;

namespace fp8kit_torch {
namespace {

constexpr const char* kFn = "fp8kit.torch.Linear";

// Scaling-state slots of one layer.
constexpr int kInput = 0, kWeight = 1, kGrad = 2, kSlots = 3;

// Per-quantization scalars: scale, scale_inv and amax, each at a 16-byte
// aligned offset (cuBLASLt reads scale_inv through 16-byte aligned
// pointers). Every quantization gets its own, so a saved tensor's scale_inv
// never changes under it (the layer's delayed-scaling scale_inv does, at
// its next quantization). Delayed scaling writes only the scale_inv (scale
// and amax live in the layer's state).
constexpr int kScale = 0, kScaleInv = 4, kAmax = 8, kScalars = 12;
float* scale_inv_of(const at::Tensor& scalars) { return scalars.data_ptr<float>() + kScaleInv; }

// One quantization of a forward or backward: the layer's slot, the
// contiguous input, its FP8 outputs (either may be undefined) and where its
// scalars go (kScale / kScaleInv / kAmax floats from there).
struct SlotJob {
  int slot;
  const at::Tensor* x;
  at::Tensor data, data_t;
  float* scalars;
  fp8kit_column_sums sums{};  // delayed scaling only; sums.sums == NULL: none
};

// Locks `mu` without ever blocking while this thread holds the GIL: a thread
// holding mu may itself wait for the GIL (CPU work releases and re-takes it),
// so waiting for mu with the GIL held could deadlock.
std::unique_lock<std::mutex> lock_state(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      lock.lock();
    } else {
      lock.lock();
    }
  }
  return lock;
}

// One Linear layer's FP8 state: the recipe, the delayed-scaling history,
// amax, scale and scale_inv of its three tensors (input, weight,
// grad_output), and the cached quantized weight.
struct LinearState : torch::CustomClassHolder {
  LinearState(bool delayed_, fp8kit_dtype fwd, fp8kit_dtype bwd, int history_len_, int margin_,
              fp8kit_amax_reduction reduction_, double amax_epsilon_, bool power_2_scale_,
              const at::Device& device_)
      : delayed(delayed_),
        fwd_fp8(fwd),
        bwd_fp8(bwd),
        history_len(history_len_),
        margin(margin_),
        reduction(reduction_),
        amax_epsilon(static_cast<float>(amax_epsilon_)),
        power_2_scale(power_2_scale_),
        device(device_) {
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
    history = at::zeros({kSlots, history_len}, opts);
    amax = at::zeros({kSlots}, opts);
    scale = at::ones({kSlots}, opts);
    scale_inv = at::ones({kSlots}, opts);
    counters = at::zeros({kSlots}, opts.dtype(at::kInt));
    non_tn = supports_non_tn(device);
  }

  fp8kit_dtype slot_dtype(int slot) const { return slot == kGrad ? bwd_fp8 : fwd_fp8; }

  // One fp8kit_delayed_scaling_update call for `slots` (rolls their amax
  // into the history). Caller holds mu.
  void update_slots(const int* slots, int n) {
    std::array<fp8kit_delayed_scaling_state, kSlots> s{};
    float* h = history.data_ptr<float>();
    for (int i = 0; i < n; ++i) {
      const int k = slots[i];
      s[i].amax_history = h + k * history_len;
      s[i].amax = amax.data_ptr<float>() + k;
      s[i].scale = scale.data_ptr<float>() + k;
      s[i].scale_inv = scale_inv.data_ptr<float>() + k;
      s[i].fp8_dtype = slot_dtype(k);
    }
    delayed_update(s.data(), n, history_len, margin, reduction, device);
  }

  // Quantizes `jobs`. Delayed scaling (caller holds mu): all jobs in one
  // fused quantize+update call (one kernel launch on CUDA for the usual
  // same-shaped layouts), each cast with its slot's scale and the amax it
  // measures rolled into the slot's history at once; the very first
  // quantization of a slot seeds the history from the tensor's own amax
  // first, so that step 0 is not cast with scale 1. Current scaling: one
  // call per job, from the tensor's own amax.
  void quantize_slots(const SlotJob* jobs, int n) {
    if (!delayed) {
      fp8kit_current_scaling_config cfg;
      cfg.amax_epsilon = amax_epsilon;
      cfg.force_pow2_scale = power_2_scale ? 1 : 0;
      for (int i = 0; i < n; ++i) {
        const SlotJob& j = jobs[i];
        ScalePtrs s;
        s.scale = j.scalars + kScale;
        s.scale_inv = j.scalars + kScaleInv;
        s.amax = j.scalars + kAmax;
        quantize_into(*j.x, slot_dtype(j.slot), j.data, j.data_t, s, &cfg);
      }
      return;
    }
    std::array<DelayedQuantizeItem, kSlots> items{};
    for (int i = 0; i < n; ++i) {
      const SlotJob& j = jobs[i];
      const int k = j.slot;
      if (!seeded[k]) seed_slot(k, *j.x);
      items[i].x = j.x;
      items[i].fp8 = slot_dtype(k);
      items[i].data = &j.data;
      items[i].data_t = &j.data_t;
      items[i].scale_inv = j.scalars + kScaleInv;
      items[i].state.amax_history = history.data_ptr<float>() + k * history_len;
      items[i].state.amax = amax.data_ptr<float>() + k;
      items[i].state.scale = scale.data_ptr<float>() + k;
      items[i].state.scale_inv = scale_inv.data_ptr<float>() + k;
      items[i].state.counter = reinterpret_cast<unsigned int*>(counters.data_ptr<int32_t>()) + k;
      items[i].sums = j.sums;
    }
    quantize_delayed_update_into(items.data(), n, history_len, margin, reduction, device);
  }

  // Rolls x's amax into slot k's history (so its first scale fits x) and
  // leaves the slot's amax accumulator at 0 again. Caller holds mu.
  void seed_slot(int k, const at::Tensor& x) {
    amax_into(x, amax.data_ptr<float>() + k);
    update_slots(&k, 1);
    amax.narrow(0, k, 1).zero_();
    seeded[k] = true;
  }

  // Whether the cached FP8 weight is `w` as it is now (same tensor, same
  // storage, same version counter) and holds the layouts needed.
  bool weight_cached(const at::Tensor& w, bool need_t) const {
    if (!cache_weight || !w_src.defined() || w.is_inference()) return false;
    return w_src.is_same(w) && w_ptr == w.data_ptr() && w_version == w._version() &&
           w_src.sizes() == w.sizes() && (!need_t || w_data_t.defined());
  }

  void clear_weight_cache() {
    w_src = at::Tensor();
    w_data = at::Tensor();
    w_data_t = at::Tensor();
    w_scalars = at::Tensor();
    w_ptr = nullptr;
    w_version = -1;
  }

  // Recipe.
  const bool delayed;
  const fp8kit_dtype fwd_fp8, bwd_fp8;
  const int history_len, margin;
  const fp8kit_amax_reduction reduction;
  const float amax_epsilon;
  const bool power_2_scale;
  at::Device device;
  bool non_tn = false;  // the core's answer for `device`

  // Delayed-scaling state, float32 on `device`: history [3, history_len]
  // (column 0 newest), amax accumulators (0 between calls), scale,
  // scale_inv [3]; and the fused quantize's block counters (int32 [3], 0
  // between calls).
  at::Tensor history, amax, scale, scale_inv, counters;
  // Tile counters of the bias gradient's column sums (int32, 0 between
  // calls), made by the first backward that computes the sums in the cast.
  at::Tensor sum_counters;

  // sum_counters with room for an N-column gradient. Caller holds mu.
  unsigned int* sum_counters_for(int64_t n) {
    const int64_t tiles = (n + 127) / 128;
    if (!sum_counters.defined() || sum_counters.numel() < tiles) {
      sum_counters = at::zeros({tiles}, at::TensorOptions().device(device).dtype(at::kInt));
    }
    return reinterpret_cast<unsigned int*>(sum_counters.data_ptr<int32_t>());
  }
  std::array<bool, kSlots> seeded{};   // slot i has been quantized before
  // Orders forward (caller's thread) and backward (autograd thread) use of
  // the delayed-scaling state and flags.
  std::mutex mu;

  // Cached quantized weight, reused while the weight is unchanged.
  bool cache_weight = false;  // opt-in (fp8kit/torch/linear.py says why)
  // The recipe's choice for the forward GEMM (set from Python with the
  // recipe; not part of the saved state).
  bool forward_fast_accumulation = false;
  at::Tensor w_src, w_data, w_data_t, w_scalars;
  const void* w_ptr = nullptr;
  int64_t w_version = -1;
};

// What one forward computes and saves.
struct Plan {
  bool dgrad = false, wgrad = false, bgrad = false;
  bool wgrad_cw = false;  // wgrad reads columnwise copies (TN-only device or M % 16 != 0)
  int64_t m = 0, k = 0, n = 0;  // tokens, in_features, out_features
};

struct Saved {
  at::Tensor x_q, x_scalars, w_q, w_scalars;
};

// Everything backward needs besides the saved tensors, in one capsule.
struct BackwardInfo {
  c10::intrusive_ptr<LinearState> st;
  Plan plan;
  std::vector<int64_t> x_sizes;
  at::ScalarType x_dtype, w_dtype, b_dtype;
};

std::vector<int64_t> out_sizes(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> s = x.sizes().vec();
  s.back() = n;
  return s;
}

at::Tensor forward_impl(LinearState& st, const at::Tensor& x_in, const at::Tensor& w_in,
                        const at::Tensor& b, const Plan& p, Saved* saved) {
  const at::Tensor x = x_in.contiguous();
  const bool need_wt = p.dgrad && !st.non_tn;
  const bool need_xt = p.wgrad && p.wgrad_cw;
  const bool save = saved != nullptr;
  at::Tensor x_data, x_t, x_scalars, w, w_data, w_data_t, w_scalars;
  {
    const auto lock = lock_state(st.mu);
    const bool requant = !st.weight_cached(w_in, need_wt);
    // The cache keeps the weight's pieces across calls: their own buffer.
    const bool cache_w = requant && st.cache_weight && !w_in.is_inference();
    if (requant) {
      st.clear_weight_cache();
      w = w_in.contiguous();
    }
    // Every FP8 buffer and scalars block of this call, carved by lifetime:
    // kept for backward, kept by the weight cache, or used only here.
    const at::ScalarType fp8 = torch_fp8_type(st.fwd_fp8);
    const std::vector<int64_t> x_cw = need_xt ? columnwise_shape(x.sizes()) : std::vector<int64_t>();
    const std::vector<int64_t> w_cw =
        requant && need_wt ? columnwise_shape(w.sizes()) : std::vector<int64_t>();
    const int64_t scalars_shape[1] = {kScalars};
    enum { kUsedHere, kSaved, kCached };  // lifetimes
    const int w_kept = cache_w ? kCached : kSaved;
    const int w_here = cache_w ? kCached : kUsedHere;
    const int x_scalars_life = save ? kSaved : kUsedHere;
    const Piece pieces[6] = {
        {true, fp8, x.sizes(), save && p.wgrad && !need_xt ? kSaved : kUsedHere},  // x_data
        {need_xt, fp8, x_cw, kSaved},                                              // x_t
        {true, at::kFloat, scalars_shape, x_scalars_life},                         // x_scalars
        {requant, fp8, requant ? w.sizes() : at::IntArrayRef(),
         save && p.dgrad && st.non_tn ? w_kept : w_here},                          // w_data
        {requant && need_wt, fp8, w_cw, w_kept},                                   // w_data_t
        {requant, at::kFloat, scalars_shape, cache_w ? kCached : x_scalars_life}}; // w_scalars
    at::Tensor t[6];
    carve(x.device(), pieces, 6, t);
    x_data = t[0];
    x_t = t[1];
    x_scalars = t[2];
    SlotJob jobs[2];
    int n = 0;
    if (requant) {
      w_data = t[3];
      w_data_t = t[4];
      w_scalars = t[5];
      jobs[n++] = SlotJob{kWeight, &w, w_data, w_data_t, w_scalars.data_ptr<float>()};
      if (cache_w) {
        st.w_data = w_data;
        st.w_data_t = w_data_t;
        st.w_scalars = w_scalars;
        st.w_src = w_in;
        st.w_ptr = w_in.data_ptr();
        st.w_version = w_in._version();
      }
    } else {
      w_data = st.w_data;
      w_data_t = st.w_data_t;
      w_scalars = st.w_scalars;
    }
    jobs[n++] = SlotJob{kInput, &x, x_data, x_t, x_scalars.data_ptr<float>()};
    st.quantize_slots(jobs, n);
  }

  // y[M, N] = x[M, K] @ w[N, K]^T (+ bias): both operands K-contiguous.
  const at::ScalarType out_dtype = x.scalar_type();
  at::Tensor y = at::empty(out_sizes(x, p.n), x.options());
  const fp8kit_tensor a = gemm_operand(st.device, st.fwd_fp8, p.m, p.k, x_data.data_ptr(),
                                       nullptr, scale_inv_of(x_scalars));
  const fp8kit_tensor bw = gemm_operand(st.device, st.fwd_fp8, p.n, p.k, w_data.data_ptr(),
                                        nullptr, scale_inv_of(w_scalars));
  fp8kit_tensor d = describe(y, *high_precision_dtype(out_dtype),
                             st.device.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU);
  fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
  cfg.trans_a = 0;
  cfg.trans_b = 1;
  // The recipe's forward_fast_accumulation (fp8kit/recipe.py says why it
  // is off by default); the gradient GEMMs always promote.
  cfg.use_split_accumulator = st.forward_fast_accumulation ? 0 : 1;
  // The bias epilogue takes a bias in D's dtype (bf16 for an fp32 D, which
  // would round an fp32 bias): fp32 outputs add the bias separately.
  const bool fused_bias = b.defined() && out_dtype != at::kFloat;
  at::Tensor bias_c;
  if (fused_bias) {
    bias_c = (b.scalar_type() == out_dtype ? b : b.to(out_dtype)).contiguous();
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

  if (saved) {
    if (p.wgrad) saved->x_q = need_xt ? x_t : x_data;
    saved->x_scalars = x_scalars;
    if (p.dgrad) saved->w_q = st.non_tn ? w_data : w_data_t;
    saved->w_scalars = w_scalars;
  }
  return y;
}

// [rows, cols] FP8 data zero-padded to [rows, cols_padded] (zeros add
// nothing to the wgrad sum over tokens).
at::Tensor pad_columns(const at::Tensor& t, int64_t cols_padded) {
  if (t.size(1) == cols_padded) return t;
  at::Tensor p = at::zeros({t.size(0), cols_padded}, t.options().dtype(at::kByte));
  p.narrow(1, 0, t.size(1)).copy_(t.view(at::kByte));
  return p.view(t.scalar_type());
}

// `p`: info.plan narrowed to the gradients this backward computes.
variable_list backward_impl(const BackwardInfo& info, const Plan& p, const variable_list& saved,
                            const at::Tensor& dy_in) {
  LinearState& st = *info.st;
  const at::Tensor& x_q = saved[0];
  const at::Tensor& x_scalars = saved[1];
  const at::Tensor& w_q = saved[2];
  const at::Tensor& w_scalars = saved[3];
  DeviceScope scope(st.device);
  const auto dev_type = st.device.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
  const at::Tensor dy = dy_in.contiguous();
  const at::TensorOptions opts = dy.options();
  at::Tensor dx, dw, db;

  if (p.m == 0) {  // no tokens: every gradient is zero
    if (p.dgrad) dx = at::zeros(info.x_sizes, opts.dtype(info.x_dtype));
    if (p.wgrad) dw = at::zeros({p.n, p.k}, opts.dtype(info.w_dtype));
    if (p.bgrad) db = at::zeros({p.n}, opts.dtype(info.b_dtype));
    return {dx, dw, db};
  }

  if (p.dgrad || p.wgrad) {
    const bool dy_row = p.dgrad || (p.wgrad && !p.wgrad_cw);
    const bool dy_col = p.wgrad && p.wgrad_cw;
    const at::ScalarType fp8 = torch_fp8_type(st.bwd_fp8);
    const std::vector<int64_t> dy_cw =
        dy_col ? columnwise_shape(dy.sizes()) : std::vector<int64_t>();
    const int64_t scalars_shape[1] = {kScalars};
    // The bias gradient (dy's column sums) comes out of dy's cast, with no
    // pass of its own, when the fused delayed-scaling kernel casts dy with
    // its transposed copy; otherwise one reduction below.
    const std::optional<fp8kit_dtype> db_dtype = high_precision_dtype(info.b_dtype);
    const bool sums_in_cast = p.bgrad && st.delayed && dy_col && p.m > 1 && p.n > 1 &&
                              db_dtype.has_value();
    const int64_t partials_shape[1] = {sums_in_cast ? fp8kit_column_sums_workspace(p.m, p.n) : 0};
    // All are used only in this backward: one lifetime, one buffer.
    const Piece pieces[4] = {{dy_row, fp8, dy.sizes(), 0}, {dy_col, fp8, dy_cw, 0},
                             {true, at::kFloat, scalars_shape, 0},
                             {sums_in_cast, at::kFloat, partials_shape, 0}};
    at::Tensor t[4];
    carve(dy.device(), pieces, 4, t);
    const at::Tensor& dy_data = t[0];
    const at::Tensor& dy_t = t[1];
    const at::Tensor& dy_scalars = t[2];
    if (sums_in_cast) db = at::empty({p.n}, opts.dtype(info.b_dtype));
    {
      std::unique_lock<std::mutex> lock;
      if (st.delayed) lock = lock_state(st.mu);
      SlotJob job{kGrad, &dy, dy_data, dy_t, dy_scalars.data_ptr<float>()};
      if (sums_in_cast) {
        job.sums = {db.data_ptr(), *db_dtype, t[3].data_ptr<float>(), st.sum_counters_for(p.n)};
      }
      st.quantize_slots(&job, 1);
    }
    if (p.dgrad) {
      // dx[M, K] = dy[M, N] @ w[N, K]: w is read K(=N)-contiguous from its
      // columnwise copy on TN-only devices.
      dx = at::empty(info.x_sizes, opts.dtype(info.x_dtype));
      const fp8kit_tensor a = gemm_operand(st.device, st.bwd_fp8, p.m, p.n, dy_data.data_ptr(),
                                           nullptr, scale_inv_of(dy_scalars));
      const fp8kit_tensor b = gemm_operand(st.device, st.fwd_fp8, p.n, p.k,
                                           st.non_tn ? w_q.data_ptr() : nullptr,
                                           st.non_tn ? nullptr : w_q.data_ptr(),
                                           scale_inv_of(w_scalars));
      fp8kit_tensor d = describe(dx, *high_precision_dtype(info.x_dtype), dev_type);
      fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
      cfg.trans_a = 0;
      cfg.trans_b = 0;
      gemm_call(a, b, d, cfg, st.device);
    }
    if (p.wgrad) {
      // dw[N, K] = dy[M, N]^T @ x[M, K]: the token dimension M is the inner
      // one, read from the columnwise copies (zero-padded to a multiple of 16).
      dw = at::empty({p.n, p.k}, opts.dtype(info.w_dtype));
      // With wgrad_cw: the columnwise copies, M zero-padded to a multiple of
      // 16; otherwise the rowwise data, read transposed. Both stay alive
      // until the GEMM below has been enqueued.
      const int64_t mk = p.wgrad_cw ? (p.m + 15) / 16 * 16 : p.m;
      const at::Tensor dy_w = p.wgrad_cw ? pad_columns(dy_t, mk) : dy_data;
      const at::Tensor x_w = p.wgrad_cw ? pad_columns(x_q, mk) : x_q;
      void* dy_ptr = dy_w.data_ptr();
      void* x_ptr = x_w.data_ptr();
      const fp8kit_tensor a =
          gemm_operand(st.device, st.bwd_fp8, mk, p.n, p.wgrad_cw ? nullptr : dy_ptr,
                       p.wgrad_cw ? dy_ptr : nullptr, scale_inv_of(dy_scalars));
      const fp8kit_tensor b =
          gemm_operand(st.device, st.fwd_fp8, mk, p.k, p.wgrad_cw ? nullptr : x_ptr,
                       p.wgrad_cw ? x_ptr : nullptr, scale_inv_of(x_scalars));
      fp8kit_tensor d = describe(dw, *high_precision_dtype(info.w_dtype), dev_type);
      fp8kit_gemm_config cfg = fp8kit_gemm_config_default();
      cfg.trans_a = 1;
      cfg.trans_b = 0;
      gemm_call(a, b, d, cfg, st.device);
    }
  }
  if (p.bgrad && !db.defined()) {
    // One reduction kernel (accumulating in float32) straight into the
    // bias dtype.
    const at::Tensor dy2 = dy.view({p.m, p.n});
    db = info.b_dtype == dy.scalar_type() ? dy2.sum(0) : dy2.sum(0, false, info.b_dtype);
  }
  return {dx, dw, db};
}

// The autograd node of one FP8 Linear call: a plain Node (rather than a
// torch::autograd::Function) because it is made on every forward of small
// layers, where Function's generic bookkeeping (input metadata, output
// wrapping, the saved_data map) is a visible share of the call. Its edges
// are (input, weight, bias); the saved FP8 tensors go through SavedVariable,
// so saved-tensor hooks see them and the engine frees them after backward.
struct LinearBackward : public torch::autograd::Node {
  BackwardInfo info;
  torch::autograd::SavedVariable x_q, x_scalars, w_q, w_scalars;

  std::string name() const override { return "fp8kit::LinearBackward"; }

  variable_list apply(variable_list&& grads) override {
    FP8KIT_PROFILE_SCOPE("fp8kit::linear_backward");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};  // y unused
    const variable_list saved = {x_q.unpack(), x_scalars.unpack(), w_q.unpack(), w_scalars.unpack()};
    Plan plan = info.plan;  // only the gradients this backward asks for
    plan.dgrad = plan.dgrad && task_should_compute_output(0);
    plan.wgrad = plan.wgrad && task_should_compute_output(1);
    plan.bgrad = plan.bgrad && task_should_compute_output(2);
    at::NoGradGuard no_grad;
    return backward_impl(info, plan, saved, grads[0]);
  }

  void release_variables() override {
    x_q.reset_data();
    x_scalars.reset_data();
    w_q.reset_data();
    w_scalars.reset_data();
  }
};

// torch holds autograd nodes by std::shared_ptr up to 2.12 and by
// c10::intrusive_ptr since; Edge::function names the one this build has.
using NodePtr = decltype(torch::autograd::Edge::function);
template <typename T, typename P = NodePtr>
struct NodeMaker;
template <typename T>
struct NodeMaker<T, std::shared_ptr<torch::autograd::Node>> {
  static std::shared_ptr<T> make() { return std::make_shared<T>(); }
};
template <typename T>
struct NodeMaker<T, c10::intrusive_ptr<torch::autograd::Node>> {
  static c10::intrusive_ptr<T> make() { return c10::make_intrusive<T>(); }
};

// Forward with autograd: the FP8 forward below autograd, then the node.
at::Tensor forward_with_grad(LinearState& st, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& b, const Plan& p) {
  Saved saved;
  at::Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    y = forward_impl(st, x, w, b, p, &saved);
  }
  auto node = NodeMaker<LinearBackward>::make();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  node->info.st = c10::intrusive_ptr<LinearState>::reclaim_copy(&st);
  node->info.plan = p;
  node->info.x_sizes = x.sizes().vec();
  node->info.x_dtype = x.scalar_type();
  node->info.w_dtype = w.scalar_type();
  node->info.b_dtype = b.defined() ? b.scalar_type() : at::kFloat;
  node->x_q = torch::autograd::SavedVariable(saved.x_q, /*is_output=*/false);
  node->x_scalars = torch::autograd::SavedVariable(saved.x_scalars, false);
  node->w_q = torch::autograd::SavedVariable(saved.w_q, false);
  node->w_scalars = torch::autograd::SavedVariable(saved.w_scalars, false);
  torch::autograd::set_history(y, NodePtr(node));
  return y;
}

at::Tensor linear_forward(LinearState& st, const at::Tensor& x, const at::Tensor& w,
                          const std::optional<at::Tensor>& bias) {
  FP8KIT_PROFILE_SCOPE("fp8kit::linear_forward");
  check_high_precision(kFn, "input", x);
  check_high_precision(kFn, "weight", w);
  FP8KIT_VALUE_CHECK(w.dim() == 2, kFn, ": weight has shape ", shape_str(w.sizes()),
                     "; it must be [out_features, in_features]");
  const int64_t n = w.size(0), k = w.size(1);
  FP8KIT_VALUE_CHECK(n > 0 && k > 0, kFn, ": weight has shape ", shape_str(w.sizes()),
                     "; an FP8 Linear needs in_features > 0 and out_features > 0");
  FP8KIT_VALUE_CHECK(x.dim() >= 1 && x.size(-1) == k, kFn, ": input has shape ",
                     shape_str(x.sizes()), " but in_features is ", k,
                     "; the last dimension of input must equal in_features");
  check_rank(kFn, "input", x);
  check_same_device(kFn, "input", x, "weight", w);
  FP8KIT_VALUE_CHECK(st.device == w.device(), kFn, ": the layer's FP8 scaling state is on ",
                     device_str(st.device), " but weight is on ", device_str(w.device()),
                     "; move the whole module with .to(device)");
  device_type_of(x, kFn, "input");
  FP8KIT_VALUE_CHECK(k % 16 == 0, kFn, ": in_features is ", k,
                     " but the FP8 GEMM needs in_features to be a multiple of 16 (cuBLASLt's K "
                     "alignment); pad the layer or run it outside fp8kit.torch.autocast");
  FP8KIT_VALUE_CHECK(n % 16 == 0, kFn, ": out_features is ", n,
                     " but the FP8 backward GEMM needs out_features to be a multiple of 16 "
                     "(cuBLASLt's K alignment for dgrad); pad the layer or run it outside "
                     "fp8kit.torch.autocast");
  at::Tensor b;
  if (bias && bias->defined()) {
    b = *bias;
    check_high_precision(kFn, "bias", b);
    FP8KIT_VALUE_CHECK(b.dim() == 1 && b.size(0) == n, kFn, ": bias has shape ",
                       shape_str(b.sizes()), " but out_features is ", n);
    check_same_device(kFn, "bias", b, "weight", w);
  }
  Plan p;
  p.k = k;
  p.n = n;
  p.m = x.numel() / k;
  const bool grad = at::GradMode::is_enabled();
  p.dgrad = grad && x.requires_grad();
  p.wgrad = grad && w.requires_grad();
  p.bgrad = grad && b.defined() && b.requires_grad();
  p.wgrad_cw = !st.non_tn || p.m % 16 != 0;
  DeviceScope scope(st.device);
  if (!p.dgrad && !p.wgrad && !p.bgrad) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_impl(st, x, w, b, p, nullptr);
  }
  return forward_with_grad(st, x, w, b, p);
}

fp8kit_amax_reduction parse_reduction(const std::string& r) {
  if (r == "max") return FP8KIT_AMAX_MAX;
  if (r == "most_recent") return FP8KIT_AMAX_MOST_RECENT;
  C10_THROW_ERROR(ValueError,
                  c10::str(kFn, ": amax reduction is '", r, "'; use 'max' or 'most_recent'"));
}

const char* reduction_name(fp8kit_amax_reduction r) {
  return r == FP8KIT_AMAX_MOST_RECENT ? "most_recent" : "max";
}

py::dict get_state(LinearState& st) {
  const auto lock = lock_state(st.mu);
  py::dict d;
  d["amax_history"] = st.history.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  d["amax"] = st.amax.to(at::kCPU, false, true);
  d["scale"] = st.scale.to(at::kCPU, false, true);
  d["scale_inv"] = st.scale_inv.to(at::kCPU, false, true);
  // Every amax is rolled into its history when it is measured (the fused
  // quantize+update); "pending" stays in the format for checkpoints written
  // when amaxes waited for the next forward.
  d["pending"] = std::vector<bool>(kSlots, false);
  d["seeded"] = std::vector<bool>(st.seeded.begin(), st.seeded.end());
  return d;
}

void set_state(LinearState& st, const py::dict& d) {
  constexpr const char* fn = "fp8kit.torch.Linear.set_extra_state";
  const auto lock = lock_state(st.mu);
  auto load = [&](const char* key, at::Tensor& dst) {
    FP8KIT_VALUE_CHECK(d.contains(key), fn, ": the saved FP8 state has no '", key, "'");
    const at::Tensor src = d[key].cast<at::Tensor>();
    FP8KIT_VALUE_CHECK(src.sizes() == dst.sizes(), fn, ": saved '", key, "' has shape ",
                       shape_str(src.sizes()), " but this layer's recipe needs ",
                       shape_str(dst.sizes()));
    dst.copy_(src);
  };
  at::NoGradGuard no_grad;
  load("amax_history", st.history);
  load("amax", st.amax);
  load("scale", st.scale);
  load("scale_inv", st.scale_inv);
  const auto pending = d["pending"].cast<std::vector<bool>>();
  const auto seeded = d["seeded"].cast<std::vector<bool>>();
  FP8KIT_VALUE_CHECK(pending.size() == kSlots && seeded.size() == kSlots, fn,
                     ": saved FP8 flags have the wrong length");
  int rolls[kSlots];
  int n_rolls = 0;
  for (int i = 0; i < kSlots; ++i) {
    st.seeded[i] = seeded[i];
    if (pending[i]) rolls[n_rolls++] = i;
  }
  // An amax such a checkpoint left waiting is rolled in now, as its next
  // forward would have done, and the accumulators start from 0.
  if (n_rolls > 0) st.update_slots(rolls, n_rolls);
  st.amax.zero_();
  st.counters.zero_();
  st.clear_weight_cache();
}

}  // namespace

void register_linear(py::module_& m) {
  py::class_<LinearState, c10::intrusive_ptr<LinearState>>(
      m, "LinearState",
      "One fp8kit Linear layer's FP8 scaling state (delayed-scaling history, amax, scale and "
      "scale_inv of its input, weight and grad_output) and its cached quantized weight.")
      .def(py::init([](const std::string& scaling, const std::string& fwd_dtype,
                       const std::string& bwd_dtype, int64_t history_len, int64_t margin,
                       const std::string& reduction, double amax_epsilon, bool power_2_scale,
                       const at::Device& device) {
             FP8KIT_VALUE_CHECK(scaling == "delayed" || scaling == "current", kFn,
                                ": scaling is '", scaling, "'; use 'delayed' or 'current'");
             FP8KIT_VALUE_CHECK(history_len >= 1 && history_len <= (1 << 20), kFn,
                                ": amax_history_len is ", history_len, "; use 1..2**20");
             FP8KIT_VALUE_CHECK(margin >= 0 && margin < 128, kFn, ": margin is ", margin,
                                "; use an int in [0, 127]");
             FP8KIT_VALUE_CHECK(amax_epsilon >= 0.0, kFn, ": amax_epsilon is ", amax_epsilon,
                                "; it must be >= 0");
             FP8KIT_VALUE_CHECK(device.is_cpu() || device.is_cuda(), kFn, ": device is ",
                                device_str(device), "; use a CPU or CUDA device");
             at::Device dev = device;
#ifdef FP8KIT_TORCH_CUDA
             if (dev.is_cuda() && !dev.has_index()) {
               dev = at::Device(at::kCUDA, c10::cuda::current_device());
             }
#else
             FP8KIT_VALUE_CHECK(!dev.is_cuda(), kFn,
                                ": this fp8kit build has no CUDA support; rebuild it on a "
                                "machine with a CUDA toolkit or keep the layer on the CPU");
#endif
             const fp8kit_dtype f = parse_fp8_name(fwd_dtype, kFn, "forward fp8 dtype");
             const fp8kit_dtype g = parse_fp8_name(bwd_dtype, kFn, "backward fp8 dtype");
             DeviceScope scope(dev);
             return c10::make_intrusive<LinearState>(
                 scaling == "delayed", f, g, static_cast<int>(history_len),
                 static_cast<int>(margin), parse_reduction(reduction), amax_epsilon,
                 power_2_scale, dev);
           }),
           py::arg("scaling"), py::arg("fwd_dtype"), py::arg("bwd_dtype"),
           py::arg("history_len") = 1, py::arg("margin") = 0, py::arg("reduction") = "max",
           py::arg("amax_epsilon") = 0.0, py::arg("power_2_scale") = false,
           py::arg("device") = at::Device(at::kCPU))
      .def_property_readonly("delayed", [](const LinearState& s) { return s.delayed; })
      .def_property_readonly("fwd_dtype", [](const LinearState& s) { return fp8_name(s.fwd_fp8); })
      .def_property_readonly("bwd_dtype", [](const LinearState& s) { return fp8_name(s.bwd_fp8); })
      .def_property_readonly("history_len", [](const LinearState& s) { return s.history_len; })
      .def_property_readonly("margin", [](const LinearState& s) { return s.margin; })
      .def_property_readonly("reduction",
                             [](const LinearState& s) { return reduction_name(s.reduction); })
      .def_property_readonly("device", [](const LinearState& s) { return s.device; })
      .def_property_readonly("non_tn", [](const LinearState& s) { return s.non_tn; })
      .def_property_readonly("amax_history", [](const LinearState& s) { return s.history; })
      .def_property_readonly("amax", [](const LinearState& s) { return s.amax; })
      .def_property_readonly("scale", [](const LinearState& s) { return s.scale; })
      .def_property_readonly("scale_inv", [](const LinearState& s) { return s.scale_inv; })
      .def_property_readonly("seeded", [](LinearState& s) {
        const auto lock = lock_state(s.mu);
        return std::vector<bool>(s.seeded.begin(), s.seeded.end());
      })
      .def_property(
          "cache_weight", [](const LinearState& s) { return s.cache_weight; },
          [](LinearState& s, bool v) {
            const auto lock = lock_state(s.mu);
            s.cache_weight = v;
            if (!v) s.clear_weight_cache();
          },
          "Reuse the quantized weight while the weight tensor is unchanged (same tensor, "
          "storage and version counter). Off by default: a write through weight.data does "
          "not bump the version counter and would leave a stale FP8 weight.")
      .def_readwrite("forward_fast_accumulation", &LinearState::forward_fast_accumulation,
                     "Fast (native-precision) accumulation in the forward GEMM: the recipe's "
                     "forward_fast_accumulation.")
      .def_property_readonly("weight_cache_valid",
                             [](const LinearState& s) { return s.w_src.defined(); })
      .def("clear_weight_cache", [](LinearState& s) {
        const auto lock = lock_state(s.mu);
        s.clear_weight_cache();
      })
      .def("to", [](LinearState& s, const at::Device& device) {
        const auto lock = lock_state(s.mu);
        at::NoGradGuard no_grad;
        s.history = s.history.to(device);
        s.amax = s.amax.to(device);
        s.scale = s.scale.to(device);
        s.scale_inv = s.scale_inv.to(device);
        s.counters = s.counters.to(device);
        s.sum_counters = at::Tensor();  // re-made (zeros) on the new device
        s.device = s.history.device();
        s.clear_weight_cache();
        DeviceScope scope(s.device);
        s.non_tn = supports_non_tn(s.device);
      }, py::arg("device"), "Moves the state to `device` in place.")
      .def("get_state", &get_state, "CPU copies of the state tensors and flags (for extra_state).")
      .def("set_state", &set_state, py::arg("state"), "Restores what get_state returned.");

  m.def("linear_forward", &linear_forward, py::arg("state"), py::arg("input"), py::arg("weight"),
        py::arg("bias") = py::none(),
        "FP8 y = input @ weight.T + bias with autograd (FP8 dgrad and wgrad), per `state`.");
}

}  // namespace fp8kit_torch
