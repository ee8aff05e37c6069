#include "fused_cast_ffi.h"

#include <string>
#include <tuple>

namespace fp8kit_jax {
namespace {

ffi::Error CheckScalar(const char* op, const char* arg, const F32Buffer& buffer) {
  if (buffer.element_count() != 1) {
    return Invalid(op, std::string(arg) + " must hold exactly one float32, got " +
                           std::to_string(buffer.element_count()) + " elements");
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error CastWorkspace::Bind(const char* op, const Device& device, ffi::AnyBuffer workspace) {
  if (workspace.size_bytes() < layout_.bytes()) {
    return Invalid(op, "the workspace result has " + std::to_string(workspace.size_bytes()) +
                           " bytes; this call needs " + std::to_string(layout_.bytes()) +
                           " (fp8kit._jax_ext.workspace_bytes)");
  }
  base_ = workspace.untyped_data();
  return ZeroBytes(op, device, base_, layout_.zeroed_bytes());
}

ffi::ErrorOr<fp8kit_fused_cast> CastWorkspace::Delayed(const char* op, const Device& device,
                                                       const DelayedState& state,
                                                       const StateResults* results,
                                                       const DelayedAttrs& attrs) const {
  const auto dims = state.history.dimensions();
  if (dims.size() != 2) {
    return ffi::Unexpected(Invalid(op, "amax_history must be 2-D [slots, amax_history_len]"));
  }
  const int64_t slots = dims[0];
  if (state.scale.element_count() != static_cast<size_t>(slots) ||
      state.seeded.element_count() != static_cast<size_t>(slots)) {
    return ffi::Unexpected(Invalid(op, "scale and seeded must hold " + std::to_string(slots) +
                                           " entries, one per amax_history row"));
  }
  if (attrs.slot < 0 || attrs.slot >= slots) {
    return ffi::Unexpected(Invalid(op, "slot " + std::to_string(attrs.slot) +
                                           " is not a row of the state's " +
                                           std::to_string(slots)));
  }
  if (state.amax.element_count() > 1) {
    return ffi::Unexpected(Invalid(op, "amax must hold one float or none"));
  }
  float* history = const_cast<float*>(state.history.typed_data());
  float* scale = const_cast<float*>(state.scale.typed_data());
  float* seeded = const_cast<float*>(state.seeded.typed_data());
  if (results != nullptr) {  // recording: the results, aliased or filled here
    for (auto [dst, src] : {std::pair<F32Buffer*, const F32Buffer*>{results->history,
                                                                    &state.history},
                            {results->scale, &state.scale},
                            {results->seeded, &state.seeded}}) {
      if (dst->element_count() != src->element_count()) {
        return ffi::Unexpected(Invalid(op, "a state result differs in size from its input"));
      }
      if (auto err = CopyIfDistinct(op, device, dst->untyped_data(), src->untyped_data(),
                                    src->size_bytes());
          err.failure()) {
        return ffi::Unexpected(err);
      }
    }
    history = results->history->typed_data();
    scale = results->scale->typed_data();
    seeded = results->seeded->typed_data();
  }
  fp8kit_fused_cast cast{};
  cast.recipe = FP8KIT_FUSED_CAST_DELAYED;
  cast.state.amax_history = history + attrs.slot * dims[1];
  cast.state.amax = layout_.amax(base_, 0);
  cast.state.scale = scale + attrs.slot;
  cast.state.scale_inv = layout_.scale_inv(base_, 0);
  cast.state.counter = layout_.counter(base_, 0);
  cast.state.seeded = seeded + attrs.slot;
  cast.delayed_config.amax_history_len = static_cast<int>(dims[1]);
  cast.delayed_config.margin = attrs.margin;
  cast.delayed_config.amax_reduction = static_cast<fp8kit_amax_reduction>(attrs.amax_reduction);
  cast.record = results != nullptr ? 1 : 0;
  if (state.amax.element_count() == 1) {  // start at the global amax (sharded values)
    if (auto err = CopyBytes(op, device, cast.state.amax, state.amax.typed_data(), sizeof(float));
        err.failure()) {
      return ffi::Unexpected(err);
    }
  }
  return cast;
}

ffi::ErrorOr<fp8kit_column_sums> CastWorkspace::ColumnSums(const char* op,
                                                           ffi::AnyBuffer sums) const {
  fp8kit_column_sums out{};
  if (!ToFp8kitDtype(sums.element_type(), &out.dtype) ||
      sums.element_count() != static_cast<size_t>(cols_)) {
    return ffi::Unexpected(Invalid(op, "the column sums must be [" + std::to_string(cols_) +
                                           "] float32, bfloat16 or float16"));
  }
  out.sums = sums.untyped_data();
  out.partials = layout_.sum_partials(base_, 0);
  out.counters = layout_.sum_counters(base_, 0);
  return out;
}

ffi::ErrorOr<fp8kit_fused_cast> CurrentCast(const char* op, fp8kit_tensor* out, F32Buffer* scale,
                                            F32Buffer* scale_inv, F32Buffer* amax,
                                            float amax_epsilon, bool power_2_scale) {
  for (auto [arg, buffer] : {std::tuple<const char*, F32Buffer*>{"the scale result", scale},
                             {"the scale_inv result", scale_inv},
                             {"the amax result", amax}}) {
    if (auto err = CheckScalar(op, arg, *buffer); err.failure()) return ffi::Unexpected(err);
  }
  out->scale = scale->typed_data();
  out->scale_inv = scale_inv->typed_data();
  out->amax = amax->typed_data();
  fp8kit_fused_cast cast{};
  cast.recipe = FP8KIT_FUSED_CAST_CURRENT;
  cast.current_config.amax_epsilon = amax_epsilon;
  cast.current_config.power_2_scale = power_2_scale ? 1 : 0;
  return cast;
}

ffi::ErrorOr<std::optional<fp8kit_tensor>> DescribeHighPrecision(
    const char* op, const char* arg, HighPrecisionResult result, const Device& device) {
  if (!result.has_value()) return std::optional<fp8kit_tensor>();
  auto t = Describe(op, arg, **result, device);
  if (t.has_error()) return ffi::Unexpected(t.error());
  return std::optional<fp8kit_tensor>(*t);
}

ffi::Error SetScaleInv(const char* op, fp8kit_tensor* out, F32Buffer* scale_inv) {
  if (auto err = CheckScalar(op, "the scale_inv result", *scale_inv); err.failure()) return err;
  out->scale_inv = scale_inv->typed_data();
  return ffi::Error::Success();
}

}  // namespace fp8kit_jax
