// The FP8 cast of a fused FFI handler (normalization_ffi.cc,
// activation_ffi.cc): the fp8kit_fused_cast (fp8kit/fused_cast.h) built
// from the handler's operands, one recipe per target:
//
//   *_delayed_update  delayed scaling, recording: the layer's whole
//       DelayedScalingState goes in (amax_history [slots, L], scale
//       [slots], seeded [slots]) and comes out updated; the results alias
//       the inputs (copied first when XLA gave distinct buffers). The cast
//       uses row `slot` (an attribute), so the state is passed as it is.
//   *_delayed         delayed scaling, read only (record = 0): the same
//       inputs and no state results (a pass that computes no gradient).
//   *_current         current scaling: the scale and amax are results.
//
// As with fp8kit_quantize_delayed_update's handler (quantize_delayed_ffi.cc),
// the delayed cast's amax accumulator, block counter and the state's unread
// scale_inv live in the uint8 workspace result (scratch.h), zeroed here,
// and an `amax` operand of one float (the global amax of the values cast,
// reduced across the devices sharing them) starts the accumulator, so a
// shard seeds, casts and records as the unsharded call. Column sums (the
// activation backward's bias gradient) take their scratch from the same
// workspace under both recipes.
//
// Each fused target may also be given one more result, last: the
// high-precision values its cast reads (the C API's y, a or dh), in the
// input's dtype, written beside the FP8 copy. A layer asks for it only to
// record the statistics of that cast, so a call without it allocates and
// writes nothing more.
#ifndef FP8KIT_JAX_EXT_FUSED_CAST_FFI_H_
#define FP8KIT_JAX_EXT_FUSED_CAST_FFI_H_

#include <cstdint>
#include <optional>
#include <utility>

#include "ffi_helpers.h"
#include "scratch.h"

namespace fp8kit_jax {

using F32Buffer = ffi::Buffer<ffi::F32>;

// The state operands of a delayed cast.
struct DelayedState {
  F32Buffer history;  // [slots, L], column 0 newest
  F32Buffer scale;    // [slots]
  F32Buffer seeded;   // [slots], 0 = fresh
  F32Buffer amax;     // [1]: the global amax of the values cast, or (0,)
};

// The recording target's state results (aliasing DelayedState's buffers).
struct StateResults {
  F32Buffer* history;
  F32Buffer* scale;
  F32Buffer* seeded;
};

// The attributes of a delayed cast.
struct DelayedAttrs {
  int64_t slot;            // the state row this cast uses
  int32_t margin;          // scale = fp8_max / amax / 2**margin
  int32_t amax_reduction;  // fp8kit_amax_reduction code
};

// One fused cast's workspace: the layout of v [rows, cols] (the values
// cast; `sums` when their column sums are written) for `recipe`.
class CastWorkspace {
 public:
  CastWorkspace(int64_t rows, int64_t cols, bool sums, fp8kit_fused_cast_recipe recipe)
      : layout_({ScratchTensor{rows, cols, sums}}, recipe == FP8KIT_FUSED_CAST_DELAYED),
        cols_(cols) {}

  // Checks the workspace result's size and zeroes the accumulators.
  ffi::Error Bind(const char* op, const Device& device, ffi::AnyBuffer workspace);

  // Delayed: the cast of row attrs.slot of `state` (recording when
  // `results` is non-null: the state is copied into them and updated
  // there), with the accumulator started at state.amax. `out` gets no
  // scale fields (the state holds them) but its scale_inv result.
  ffi::ErrorOr<fp8kit_fused_cast> Delayed(const char* op, const Device& device,
                                          const DelayedState& state, const StateResults* results,
                                          const DelayedAttrs& attrs) const;

  // The column sums of v into `sums` ([cols], float32/bfloat16/float16).
  ffi::ErrorOr<fp8kit_column_sums> ColumnSums(const char* op, ffi::AnyBuffer sums) const;

 private:
  ScratchLayout layout_;
  int64_t cols_;
  void* base_ = nullptr;
};

// Current scaling: the cast and its config; `out` gets the scale, scale_inv
// and amax results (one float32 each, checked).
ffi::ErrorOr<fp8kit_fused_cast> CurrentCast(const char* op, fp8kit_tensor* out, F32Buffer* scale,
                                            F32Buffer* scale_inv, F32Buffer* amax,
                                            float amax_epsilon, bool power_2_scale);

// The scale_inv result of a delayed cast (one float32) into `out`.
ffi::Error SetScaleInv(const char* op, fp8kit_tensor* out, F32Buffer* scale_inv);

// The optional high-precision result (see above): absent, or the values
// cast in the input's dtype and shape (the core checks both).
using HighPrecisionResult = std::optional<ffi::Result<ffi::AnyBuffer>>;

// Its descriptor, or nullopt when the result is absent; `arg` names it in
// errors.
ffi::ErrorOr<std::optional<fp8kit_tensor>> DescribeHighPrecision(
    const char* op, const char* arg, HighPrecisionResult result, const Device& device);

// The core's pointer for it: NULL when absent.
inline fp8kit_tensor* Pointer(std::optional<fp8kit_tensor>& t) { return t ? &*t : nullptr; }

// Binds it: after every other result of the target.
template <typename Binding>
auto BindHighPrecision(Binding&& binding) {
  return std::move(binding).template OptionalRet<ffi::AnyBuffer>();
}

// Bindings of the operands every fused target of a recipe shares.
template <typename Binding>
auto BindDelayedStateArgs(Binding&& binding) {
  return std::move(binding)
      .template Arg<F32Buffer>()   // amax_history: [slots, L], column 0 newest
      .template Arg<F32Buffer>()   // scale: [slots], each slot's scale
      .template Arg<F32Buffer>()   // seeded: [slots], 0 = fresh (the first cast seeds it)
      .template Arg<F32Buffer>();  // amax: [1] the global amax of the values cast, or (0,)
}

template <typename Binding>
auto BindStateResults(Binding&& binding) {
  return std::move(binding)
      .template Ret<F32Buffer>()   // amax_history (aliases the input)
      .template Ret<F32Buffer>()   // scale: the next scales (aliased)
      .template Ret<F32Buffer>();  // seeded (aliases the input)
}

template <typename Binding>
auto BindDelayedAttrs(Binding&& binding) {
  return std::move(binding)
      .template Attr<int64_t>("slot")             // slot: the state row of this cast
      .template Attr<int32_t>("margin")           // margin: scale = fp8_max / amax / 2**margin
      .template Attr<int32_t>("amax_reduction");  // amax_reduction: fp8kit_amax_reduction code
}

template <typename Binding>
auto BindCurrentAttrs(Binding&& binding) {
  return std::move(binding)
      .template Attr<float>("amax_epsilon")    // amax_epsilon: lower bound on amax (0: none)
      .template Attr<bool>("power_2_scale");   // power_2_scale: round scale down to 2^k
}

}  // namespace fp8kit_jax

#endif  // FP8KIT_JAX_EXT_FUSED_CAST_FFI_H_
