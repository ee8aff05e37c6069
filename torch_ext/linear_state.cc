#include "linear_state.h"

#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

std::string float_str(float v) {
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

// A saved scale_inv must be 1 / scale as the core computes it (a float32
// division); one float32 ulp either way is allowed, for a division that
// rounds otherwise. A mismatch would cast with one scale and dequantize
// with another.
void check_reciprocals(const char* fn, const at::Tensor& scale, const at::Tensor& scale_inv) {
  const at::Tensor s = scale.to(at::kCPU).contiguous();
  const at::Tensor si = scale_inv.to(at::kCPU).contiguous();
  const float* sp = s.data_ptr<float>();
  const float* ip = si.data_ptr<float>();
  for (int64_t i = 0; i < s.numel(); ++i) {
    const float want = 1.0f / sp[i];
    const bool ok = ip[i] == want || ip[i] == std::nextafter(want, 0.0f) ||
                    ip[i] == std::nextafter(want, std::numeric_limits<float>::infinity());
    if (C10_UNLIKELY(!ok)) {
      C10_THROW_ERROR(ValueError,
                      c10::str(fn, ": saved 'scale_inv' holds ", float_str(ip[i]),
                               " (flat index ", i, ") but saved 'scale' holds ",
                               float_str(sp[i]), " there; scale_inv must be 1 / scale (",
                               float_str(want), " in float32): the checkpoint is corrupt (drop "
                               "the entry to start the FP8 state fresh)"));
    }
  }
}

}  // namespace

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

LinearState::LinearState(const LinearRecipe& recipe_, const at::Device& device_)
    : recipe(recipe_), device(device_), non_tn(supports_non_tn(device_)) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  history = at::zeros({kSlots, recipe.amax_history_len}, opts);
  amax = at::zeros({kSlots}, opts);
  scale = at::ones({kSlots}, opts);
  scale_inv = at::ones({kSlots}, opts);
  counters = at::zeros({kSlots}, opts.dtype(at::kInt));
  seeded_flags = at::zeros({kSlots}, opts);
}

LinearState::LinearState(const LinearRecipe& recipe_, const at::Tensor& history_,
                         const at::Tensor& amax_, const at::Tensor& scale_,
                         const at::Tensor& scale_inv_, const at::Tensor& counters_,
                         const at::Tensor& seeded_flags_)
    : recipe(recipe_),
      device(history_.device()),
      non_tn(supports_non_tn(history_.device())),
      history(history_),
      amax(amax_),
      scale(scale_),
      scale_inv(scale_inv_),
      counters(counters_),
      seeded_flags(seeded_flags_) {}

void LinearState::quantize_slots(const SlotJob* jobs, int n, bool record) {
  if (!recipe.delayed) {
    fp8kit_current_scaling_config cfg;
    cfg.amax_epsilon = recipe.amax_epsilon;
    cfg.power_2_scale = recipe.power_2_scale ? 1 : 0;
    // One call for all: its launches are one tensor's, whatever n.
    std::array<CurrentQuantizeItem, kSlots> items{};
    for (int i = 0; i < n; ++i) {
      const SlotJob& j = jobs[i];
      ScalePtrs s;
      s.scale = j.scalars + kScale;
      s.scale_inv = j.scalars + kScaleInv;
      s.amax = j.scalars + kAmax;
      items[i] = CurrentQuantizeItem{j.x, slot_dtype(j.slot), &j.data, &j.columnwise_data, s,
                                     j.sums};
    }
    quantize_current_into(items.data(), n, cfg, device);
    return;
  }
  std::array<DelayedQuantizeItem, kSlots> items{};
  float* flags = seeded_flags.data_ptr<float>();
  for (int i = 0; i < n; ++i) {
    const SlotJob& j = jobs[i];
    const int k = j.slot;
    items[i].x = j.x;
    items[i].fp8 = slot_dtype(k);
    items[i].data = &j.data;
    items[i].columnwise_data = &j.columnwise_data;
    items[i].scale_inv = j.scalars + kScaleInv;
    items[i].state.amax_history = history.data_ptr<float>() + k * recipe.amax_history_len;
    items[i].state.amax = amax.data_ptr<float>() + k;
    items[i].state.scale = scale.data_ptr<float>() + k;
    items[i].state.scale_inv = scale_inv.data_ptr<float>() + k;
    items[i].state.counter = reinterpret_cast<unsigned int*>(counters.data_ptr<int32_t>()) + k;
    items[i].state.seeded = seeded[k] ? nullptr : flags + k;
    items[i].sums = j.sums;
  }
  fp8kit_delayed_scaling_config cfg;
  cfg.amax_history_len = recipe.amax_history_len;
  cfg.margin = recipe.margin;
  cfg.amax_reduction = recipe.amax_reduction;
  quantize_delayed_update_into(items.data(), n, cfg, record, device);
  // A recorded quantization leaves its slot seeded (the core has set the
  // device flag); one that is not recorded changes no state.
  if (record) {
    for (int i = 0; i < n; ++i) seeded[jobs[i].slot] = true;
  }
}

unsigned int* LinearState::sum_counters_for(int64_t n) {
  const int64_t tiles = (n + 127) / 128;
  if (!sum_counters.defined() || sum_counters.numel() < tiles) {
    sum_counters = at::zeros({tiles}, at::TensorOptions().device(device).dtype(at::kInt));
  }
  return reinterpret_cast<unsigned int*>(sum_counters.data_ptr<int32_t>());
}

bool LinearState::weight_cached(const at::Tensor& w, fp8kit_copies need) const {
  if (!cache_weight || !w_src.defined() || w.is_inference()) return false;
  return w_src.is_same(w) && w_ptr == w.data_ptr() && w_version == w._version() &&
         w_src.sizes() == w.sizes() && (!need.rowwise || w_data.defined()) &&
         (!need.columnwise || w_columnwise.defined());
}

void LinearState::keep_weight(const at::Tensor& w, const at::Tensor& data,
                              const at::Tensor& columnwise, const at::Tensor& scalars) {
  w_data = data;
  w_columnwise = columnwise;
  w_scalars = scalars;
  w_src = w;
  w_ptr = w.data_ptr();
  w_version = w._version();
}

void LinearState::clear_weight_cache() {
  w_src = at::Tensor();
  w_data = at::Tensor();
  w_columnwise = at::Tensor();
  w_scalars = at::Tensor();
  w_ptr = nullptr;
  w_version = -1;
}

void LinearState::move_to(const at::Device& to) {
  at::NoGradGuard no_grad;
  history = history.to(to);
  amax = amax.to(to);
  scale = scale.to(to);
  scale_inv = scale_inv.to(to);
  counters = counters.to(to);
  seeded_flags = seeded_flags.to(to);
  sum_counters = at::Tensor();  // re-made (zeros) on the new device
  device = history.device();
  clear_weight_cache();
  DeviceScope scope(device);
  non_tn = supports_non_tn(device);
}

py::dict LinearState::checkpoint() {
  const auto lock = lock_state(mu);
  py::dict d;
  d["recipe"] = recipe_to_plain(recipe);
  // The three arrays fp8kit.jax's DelayedScalingState holds. Not state: the
  // amax accumulators and counters (0 between calls) and scale_inv (always
  // 1 / scale, recomputed on load).
  d["amax_history"] = history.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  d["scale"] = scale.to(at::kCPU, false, true);
  d["seeded"] = seeded_flags.to(at::kCPU, false, true);
  return d;
}

std::vector<bool> LinearState::seeded_slots() const {
  const at::Tensor flags = seeded_flags.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  const float* f = flags.data_ptr<float>();
  std::vector<bool> out(kSlots);
  for (int i = 0; i < kSlots; ++i) out[i] = f[i] != 0.0f;
  return out;
}

c10::intrusive_ptr<LinearState> LinearState::from_checkpoint(py::handle saved_in,
                                                             const at::Device& device,
                                                             const std::string& where) {
  const char* fn = where.c_str();
  FP8KIT_TYPE_CHECK(PyDict_Check(saved_in.ptr()), fn, ": the saved FP8 state is ",
                    value_str(saved_in), "; it must be the dict Linear.get_extra_state() wrote");
  const py::dict saved = py::reinterpret_borrow<py::dict>(saved_in);
  auto get = [&](const char* key) {
    FP8KIT_VALUE_CHECK(saved.contains(key), fn, ": the saved FP8 state has no '", key,
                       "'; the checkpoint is incomplete (drop the entry to start the FP8 state "
                       "fresh)");
    return py::object(saved[key]);
  };
  c10::intrusive_ptr<LinearState> st =
      make_linear_state(recipe_from_plain(get("recipe"), where), device);
  // `positive`: every value finite and > 0 (scales). Otherwise values may
  // be NaN or +inf (a recorded amax of a tensor holding them, which the
  // delayed-scaling rule skips) but not negative (an amax is a max of |x|).
  auto load = [&](const char* key, at::Tensor& dst, bool positive) {
    const at::Tensor src = read_tensor(get(key), c10::str(fn, ": saved '", key, "'"));
    check_dense(fn, c10::str("saved '", key, "'").c_str(), src);
    FP8KIT_VALUE_CHECK(src.scalar_type() == at::kFloat && src.sizes() == dst.sizes(), fn,
                      ": saved '", key, "' is ", dtype_str(src.scalar_type()), " of shape ",
                      shape_str(src.sizes()), " but the saved recipe needs torch.float32 of shape ",
                      shape_str(dst.sizes()));
    const at::Tensor v = src.to(at::kCPU);
    const at::Tensor bad = positive ? (~at::isfinite(v)).logical_or(v <= 0) : v < 0;
    if (C10_UNLIKELY(bad.any().item<bool>())) {
      const int64_t i = bad.flatten().nonzero()[0].item<int64_t>();
      C10_THROW_ERROR(ValueError,
                      c10::str(fn, ": saved '", key, "' holds ", v.flatten()[i].item<float>(),
                               " (flat index ", i, "); ", key, " values must be ",
                               positive ? "finite and > 0" : ">= 0 (NaN and inf allowed)",
                               ": the checkpoint is corrupt (drop the entry to start the FP8 "
                               "state fresh)"));
    }
    dst.copy_(src);
  };
  at::NoGradGuard no_grad;
  load("amax_history", st->history, /*positive=*/false);
  load("scale", st->scale, /*positive=*/true);
  if (saved.contains("scale_inv")) {
    // An older entry (extra-state formats before the three-array one)
    // saved scale_inv too: it must still be the reciprocal.
    load("scale_inv", st->scale_inv, /*positive=*/true);
    check_reciprocals(fn, st->scale, st->scale_inv);
  } else {
    // The float32 quotient, as the core computes it (IEEE division on the CPU).
    st->scale_inv.copy_(st->scale.to(at::kCPU).reciprocal());
  }
  const py::object seeded = get("seeded");
  if (PyList_Check(seeded.ptr())) {  // older entries: a list of bools
    bool ok = PyList_GET_SIZE(seeded.ptr()) == kSlots;
    for (int i = 0; ok && i < kSlots; ++i) ok = PyBool_Check(PyList_GET_ITEM(seeded.ptr(), i));
    FP8KIT_TYPE_CHECK(ok, fn, ": saved 'seeded' is ", value_str(seeded),
                      "; it must be float32 [", kSlots, "] (or a list of ", kSlots, " bools)");
    for (int i = 0; i < kSlots; ++i) st->seeded[i] = PyList_GET_ITEM(seeded.ptr(), i) == Py_True;
  } else {
    const at::Tensor flags = read_tensor(seeded, c10::str(fn, ": saved 'seeded'"));
    FP8KIT_VALUE_CHECK(flags.scalar_type() == at::kFloat && flags.dim() == 1 &&
                           flags.size(0) == kSlots,
                       fn, ": saved 'seeded' is ", dtype_str(flags.scalar_type()), " of shape ",
                       shape_str(flags.sizes()), "; it must be torch.float32 of shape [", kSlots,
                       "] (0.0 fresh, 1.0 seeded: input, weight, grad_output)");
    const at::Tensor v = flags.to(at::kCPU).contiguous();
    for (int i = 0; i < kSlots; ++i) {
      const float f = v.data_ptr<float>()[i];
      FP8KIT_VALUE_CHECK(f == 0.0f || f == 1.0f, fn, ": saved 'seeded' holds ", float_str(f),
                         " (flat index ", i, "); seeded values must be 0.0 (fresh) or 1.0 "
                         "(seeded): the checkpoint is corrupt (drop the entry to start the FP8 "
                         "state fresh)");
      st->seeded[i] = f == 1.0f;
    }
  }
  st->seeded_flags.copy_(at::tensor(std::vector<float>(st->seeded.begin(), st->seeded.end())));
  return st;
}

c10::intrusive_ptr<LinearState> make_linear_state(const LinearRecipe& recipe,
                                                  const at::Device& device) {
  constexpr const char* fn = "fp8kit.torch.Linear";
  FP8KIT_VALUE_CHECK(device.is_cpu() || device.is_cuda(), fn, ": device is ", device_str(device),
                     "; use a CPU or CUDA device");
  at::Device dev = device;
#ifdef FP8KIT_TORCH_CUDA
  if (dev.is_cuda() && !dev.has_index()) dev = at::Device(at::kCUDA, c10::cuda::current_device());
#else
  FP8KIT_VALUE_CHECK(!dev.is_cuda(), fn,
                     ": this fp8kit build has no CUDA support; rebuild it on a machine with a "
                     "CUDA toolkit or keep the layer on the CPU");
#endif
  DeviceScope scope(dev);
  return c10::make_intrusive<LinearState>(recipe, dev);
}

}  // namespace fp8kit_torch
