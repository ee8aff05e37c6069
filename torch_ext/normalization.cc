// norm_forward / norm_backward: LayerNorm and RMSNorm with the FP8 cast of
// the output fused in (fp8kit/normalization.h).
#include <cmath>
#include <string>
#include <tuple>

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

// "LayerNorm" / "RMSNorm" and the epsilon -> the core's config.
fp8kit_norm_config norm_config(const char* fn, const std::string& name, double epsilon) {
  fp8kit_norm_config config;
  if (name == "LayerNorm") {
    config.type = FP8KIT_LAYERNORM;
  } else if (name == "RMSNorm") {
    config.type = FP8KIT_RMSNORM;
  } else {
    C10_THROW_ERROR(ValueError, c10::str(fn, ": normalization is '", name,
                                         "'; use 'LayerNorm' or 'RMSNorm'"));
  }
  FP8KIT_VALUE_CHECK(std::isfinite(epsilon) && epsilon >= 0.0, fn, ": epsilon is ", epsilon,
                     "; it must be a finite float >= 0 (0 disables it)");
  config.epsilon = static_cast<float>(epsilon);
  return config;
}

// gamma (and beta for LayerNorm; None for RMSNorm): x's dtype, [hidden],
// on x's device, 16-byte aligned.
void check_norm_params(const char* fn, fp8kit_norm_type type, const at::Tensor& x,
                       const at::Tensor& gamma, const at::Tensor& beta) {
  const int64_t hidden = x.size(-1);
  check_param(fn, "gamma", gamma, x, hidden);
  if (type == FP8KIT_LAYERNORM) {
    FP8KIT_VALUE_CHECK(beta.defined(), fn, ": beta is None but LayerNorm needs beta [", hidden,
                       "]; pass it (or use normalization='RMSNorm')");
    check_param(fn, "beta", beta, x, hidden);
  } else {
    FP8KIT_VALUE_CHECK(!beta.defined(), fn,
                       ": beta is given but RMSNorm has no beta; pass beta=None");
  }
}

py::tuple norm_forward_binding(py::handle x_in, py::handle gamma_in, py::handle beta_in,
                               py::handle normalization, py::handle epsilon, py::handle state,
                               py::handle slot_in, py::handle record_in, py::handle rowwise_in,
                               py::handle columnwise_in, py::handle want_y_in) {
  FP8KIT_PROFILE_SCOPE("fp8kit::norm_forward");
  constexpr const char* fn = "fp8kit.torch.norm_forward";
  const std::string name = read_str(normalization, c10::str(fn, ": normalization"));
  const double eps = read_epsilon(epsilon, c10::str(fn, ": epsilon"));
  const CastArgs cast = read_cast_args(fn, state, slot_in, record_in, rowwise_in, columnwise_in);
  const bool want_y = read_bool(want_y_in, c10::str(fn, ": want_y"));
  const at::Tensor x = read_tensor(x_in, c10::str(fn, ": x"));
  const at::Tensor gamma = read_tensor(gamma_in, c10::str(fn, ": gamma"));
  const at::Tensor beta =
      beta_in.is_none() ? at::Tensor() : read_tensor(beta_in, c10::str(fn, ": beta"));
  const NormForwardOut out = norm_forward(fn, x, gamma, beta, name, eps, cast, want_y);
  return py::make_tuple(optional_tensor(out.cast.data), optional_tensor(out.cast.columnwise_data),
                        out.cast.scale_inv(), optional_tensor(out.mean), out.rsigma,
                        optional_tensor(out.y));
}

py::tuple norm_backward_binding(py::handle dy_in, py::handle x_in, py::handle mean_in,
                                py::handle rsigma_in, py::handle gamma_in,
                                py::handle normalization, py::handle epsilon) {
  FP8KIT_PROFILE_SCOPE("fp8kit::norm_backward");
  constexpr const char* fn = "fp8kit.torch.norm_backward";
  const std::string name = read_str(normalization, c10::str(fn, ": normalization"));
  const double eps = read_epsilon(epsilon, c10::str(fn, ": epsilon"));
  const at::Tensor mean =
      mean_in.is_none() ? at::Tensor() : read_tensor(mean_in, c10::str(fn, ": mean"));
  const auto [dx, dgamma, dbeta] =
      norm_backward(fn, read_tensor(dy_in, c10::str(fn, ": dy")),
                    read_tensor(x_in, c10::str(fn, ": x")), mean,
                    read_tensor(rsigma_in, c10::str(fn, ": rsigma")),
                    read_tensor(gamma_in, c10::str(fn, ": gamma")), name, eps);
  return py::make_tuple(dx, dgamma, optional_tensor(dbeta));
}

}  // namespace

NormForwardOut norm_forward(const char* fn, const at::Tensor& x_in, const at::Tensor& gamma,
                            const at::Tensor& beta, const std::string& normalization,
                            double epsilon, const CastArgs& cast, bool want_y) {
  const fp8kit_norm_config config = norm_config(fn, normalization, epsilon);
  LinearState& st = *cast.state;
  const int slot = cast.slot;
  const at::Tensor x = fused_input(fn, "x", x_in, st);
  FP8KIT_VALUE_CHECK(x.size(-1) > 0 && x.size(-1) % FP8KIT_GEMM_DIM_MULTIPLE == 0, fn,
                     ": x has last dimension ", x.size(-1), "; it must be a positive multiple of ",
                     FP8KIT_GEMM_DIM_MULTIPLE, " (the inner dimension of the FP8 GEMM that reads "
                     "the output): pad the features or run the layer outside fp8kit autocast");
  check_norm_params(fn, config.type, x, gamma, beta);

  NormForwardOut out;
  const int64_t rows = x.numel() / x.size(-1);
  const auto f32 = x.options().dtype(at::kFloat);
  out.rsigma = at::empty({rows}, f32);
  if (config.type == FP8KIT_LAYERNORM) out.mean = at::empty({rows}, f32);
  if (want_y) out.y = at::empty_like(x);
  out.cast = alloc_fused_cast(st, slot, x.sizes(), cast.rowwise, cast.columnwise);

  const fp8kit_device_type dev = device_type_of(x, fn, "x");
  const fp8kit_tensor xd = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  const fp8kit_tensor gd = describe(gamma, xd.dtype, dev);
  const fp8kit_tensor bd = beta.defined() ? describe(beta, xd.dtype, dev) : fp8kit_tensor{};
  fp8kit_tensor yd = want_y ? describe(out.y, xd.dtype, dev) : fp8kit_tensor{};
  fp8kit_tensor md = out.mean.defined() ? describe(out.mean, FP8KIT_FLOAT32, dev)
                                        : fp8kit_tensor{};
  fp8kit_tensor rd = describe(out.rsigma, FP8KIT_FLOAT32, dev);
  {
    DeviceScope scope(st.device);
    const auto lock = lock_state(st.mu);
    fp8kit_tensor od;
    fp8kit_fused_cast fc;
    describe_fused_cast(st, slot, cast.record, out.cast, xd, &od, &fc);
    void* stream = current_stream(x.device());
    check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
      return fp8kit_norm_forward(&config, &xd, &gd, beta.defined() ? &bd : nullptr,
                                 want_y ? &yd : nullptr, &od, &fc,
                                 out.mean.defined() ? &md : nullptr, &rd, stream);
    }));
    finish_fused_cast(st, slot, cast.record);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_forward_values(
    const char* fn, const at::Tensor& x_in, const at::Tensor& gamma, const at::Tensor& beta,
    const std::string& normalization, double epsilon) {
  const fp8kit_norm_config config = norm_config(fn, normalization, epsilon);
  const at::Tensor x = fused_input(fn, "x", x_in);
  check_norm_params(fn, config.type, x, gamma, beta);
  const int64_t rows = x.numel() / x.size(-1);
  const auto f32 = x.options().dtype(at::kFloat);
  const at::Tensor y = at::empty_like(x), rsigma = at::empty({rows}, f32);
  const at::Tensor mean = config.type == FP8KIT_LAYERNORM ? at::empty({rows}, f32) : at::Tensor();

  const fp8kit_device_type dev = device_type_of(x, fn, "x");
  const fp8kit_tensor xd = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  const fp8kit_tensor gd = describe(gamma, xd.dtype, dev);
  const fp8kit_tensor bd = beta.defined() ? describe(beta, xd.dtype, dev) : fp8kit_tensor{};
  fp8kit_tensor yd = describe(y, xd.dtype, dev), rd = describe(rsigma, FP8KIT_FLOAT32, dev);
  fp8kit_tensor md = mean.defined() ? describe(mean, FP8KIT_FLOAT32, dev) : fp8kit_tensor{};
  DeviceScope scope(x.device());
  void* stream = current_stream(x.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_norm_forward(&config, &xd, &gd, beta.defined() ? &bd : nullptr, &yd, nullptr,
                               nullptr, mean.defined() ? &md : nullptr, &rd, stream);
  }));
  return {y, mean, rsigma};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(
    const char* fn, const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& mean_in,
    const at::Tensor& rsigma_in, const at::Tensor& gamma, const std::string& normalization,
    double epsilon) {
  const fp8kit_norm_config config = norm_config(fn, normalization, epsilon);
  const at::Tensor x = fused_input(fn, "x", x_in);
  const at::Tensor dy = fused_like(fn, "dy", dy_in, x, "x");
  check_param(fn, "gamma", gamma, x, x.size(-1));
  const int64_t rows = x.numel() / x.size(-1);
  const at::Tensor rsigma = row_stats(fn, "rsigma", rsigma_in, x, rows);
  at::Tensor mean;
  if (config.type == FP8KIT_LAYERNORM) {
    FP8KIT_VALUE_CHECK(mean_in.defined(), fn,
                       ": mean is None but LayerNorm's backward needs the mean its forward "
                       "returned");
    mean = row_stats(fn, "mean", mean_in, x, rows);
  } else {
    FP8KIT_VALUE_CHECK(!mean_in.defined(), fn,
                       ": mean is given but RMSNorm has no mean; pass mean=None");
  }

  const int64_t hidden = x.size(-1);
  const at::Tensor dx = at::empty_like(x);
  const at::Tensor dgamma = at::empty({hidden}, gamma.options());
  const at::Tensor dbeta =
      config.type == FP8KIT_LAYERNORM ? at::empty({hidden}, gamma.options()) : at::Tensor();
  const at::Tensor workspace =
      at::empty({fp8kit_norm_backward_workspace(rows, hidden)}, x.options().dtype(at::kFloat));

  const fp8kit_device_type dev = device_type_of(x, fn, "x");
  const fp8kit_dtype hp = *high_precision_dtype(x.scalar_type());
  const fp8kit_tensor xd = describe(x, hp, dev), dyd = describe(dy, hp, dev);
  const fp8kit_tensor gd = describe(gamma, hp, dev), rd = describe(rsigma, FP8KIT_FLOAT32, dev);
  const fp8kit_tensor md = mean.defined() ? describe(mean, FP8KIT_FLOAT32, dev) : fp8kit_tensor{};
  fp8kit_tensor dxd = describe(dx, hp, dev), dgd = describe(dgamma, hp, dev);
  fp8kit_tensor dbd = dbeta.defined() ? describe(dbeta, hp, dev) : fp8kit_tensor{};
  DeviceScope scope(x.device());
  void* stream = current_stream(x.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_norm_backward(&config, &dyd, &xd, mean.defined() ? &md : nullptr, &rd, &gd,
                                &dxd, &dgd, dbeta.defined() ? &dbd : nullptr,
                                workspace.numel() ? workspace.data_ptr<float>() : nullptr,
                                stream);
  }));
  return {dx, dgamma, dbeta};
}

void register_normalization(py::module_& m) {
  m.def("norm_forward", &norm_forward_binding, py::arg("x"), py::arg("gamma"), py::arg("beta"),
        py::arg("normalization"), py::arg("epsilon"), py::arg("state"), py::arg("slot"),
        py::arg("record"), py::arg("rowwise") = true, py::arg("columnwise") = false,
        py::arg("want_y") = false,
        "LayerNorm ('LayerNorm') or RMSNorm ('RMSNorm') of x over its last dimension with the "
        "FP8 cast of the float32 result fused in, cast with slot `slot` of LinearState `state` "
        "(delayed scaling: its history and scale; record: roll this amax in). Returns (data, "
        "columnwise_data, scale_inv, mean, rsigma, y): the FP8 copies asked for (else None), "
        "1/the scale used (float32[1]), mean (LayerNorm; float32 [rows]) and rsigma (float32 "
        "[rows]) for the backward, y in x's dtype when want_y.");
  m.def("norm_backward", &norm_backward_binding, py::arg("dy"), py::arg("x"), py::arg("mean"),
        py::arg("rsigma"), py::arg("gamma"), py::arg("normalization"), py::arg("epsilon"),
        "Gradients of norm_forward's y: (dx, dgamma, dbeta), dbeta None for RMSNorm; mean and "
        "rsigma are what norm_forward returned (mean None for RMSNorm).");
}

}  // namespace fp8kit_torch
