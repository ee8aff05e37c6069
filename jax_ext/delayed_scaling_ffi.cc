// FFI handler for fp8kit_delayed_scaling_update: n tensors' amax histories
// and scales updated in one call (one kernel launch on CUDA).
//
// The histories and scales are stacked: history [n, L], amax [n], scale [n].
// The core updates history and scale in place, so the Python side aliases
// those inputs to the matching outputs (input_output_aliases); if XLA ever
// hands over distinct buffers, the inputs are copied to the outputs first.
#include <string>
#include <utility>
#include <vector>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_delayed_scaling_update";

ffi::Error UpdateImpl(const Device& device, ffi::Buffer<ffi::F32> history_in,
                      ffi::Buffer<ffi::F32> amax, ffi::Buffer<ffi::F32> scale_in,
                      ffi::Result<ffi::Buffer<ffi::F32>> history,
                      ffi::Result<ffi::Buffer<ffi::F32>> scale,
                      ffi::Result<ffi::Buffer<ffi::F32>> scale_inv, int32_t margin,
                      int32_t amax_reduction, ffi::Span<const int32_t> fp8_dtypes) {
  const auto dims = history_in.dimensions();
  if (dims.size() != 2) return Invalid(kOp, "amax_history must be 2-D [n, amax_history_len]");
  const int64_t n = dims[0], len = dims[1];
  if (amax.element_count() != static_cast<size_t>(n) ||
      scale_in.element_count() != static_cast<size_t>(n) ||
      scale_inv->element_count() != static_cast<size_t>(n) ||
      history->element_count() != history_in.element_count() ||
      scale->element_count() != static_cast<size_t>(n)) {
    return Invalid(kOp, "amax, scale and scale_inv must hold n = " + std::to_string(n) +
                            " floats, one per history row");
  }
  if (fp8_dtypes.size() != static_cast<size_t>(n)) {
    return Invalid(kOp, "fp8_dtypes must list one FP8 dtype per tensor (" + std::to_string(n) +
                            "), got " + std::to_string(fp8_dtypes.size()));
  }
  if (n == 0) return ffi::Error::Success();
  if (auto err = CopyIfDistinct(kOp, device, history->typed_data(), history_in.typed_data(),
                                history_in.size_bytes());
      err.failure()) {
    return err;
  }
  if (auto err = CopyIfDistinct(kOp, device, scale->typed_data(), scale_in.typed_data(),
                                scale_in.size_bytes());
      err.failure()) {
    return err;
  }
  std::vector<fp8kit_delayed_scaling_state> states(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    states[i].amax_history = history->typed_data() + i * len;
    states[i].amax = amax.typed_data() + i;
    states[i].scale = scale->typed_data() + i;
    states[i].scale_inv = scale_inv->typed_data() + i;
    states[i].fp8_dtype = static_cast<fp8kit_dtype>(fp8_dtypes[i]);
  }
  fp8kit_delayed_scaling_config config;
  config.amax_history_len = static_cast<int>(len);
  config.margin = margin;
  config.amax_reduction = static_cast<fp8kit_amax_reduction>(amax_reduction);
  return FromStatus(fp8kit_delayed_scaling_update(states.data(), static_cast<int>(n), &config,
                                                  device.type, device.index, device.stream));
}

template <typename Binding>
auto BindUpdate(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::Buffer<ffi::F32>>()   // amax_history: [n, L], row i = tensor i, col 0 newest
      .template Arg<ffi::Buffer<ffi::F32>>()   // amax: [n], each tensor's newest amax
      .template Arg<ffi::Buffer<ffi::F32>>()   // scale: [n], the scales in use (kept if amax bad)
      .template Ret<ffi::Buffer<ffi::F32>>()   // amax_history: [n, L] rolled (aliases the input)
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale: [n] new scales (aliases the input)
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale_inv: [n] = 1/scale
      .template Attr<int32_t>("margin")        // margin: scale = fp8_max / amax / 2**margin
      .template Attr<int32_t>("amax_reduction")  // amax_reduction: fp8kit_amax_reduction code
      .template Attr<ffi::Span<const int32_t>>("fp8_dtypes");  // fp8_dtypes: [n] fp8kit_dtype codes
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(delayed_scaling_update, fp8kit_jax::UpdateImpl, fp8kit_jax::BindUpdate);
