// The FP8 cast a fused kernel (normalization, activation) applies to its
// float32 result (fp8kit/fused_cast.h), taken from one slot of a layer's
// LinearState: delayed scaling reads and updates that slot's history,
// scale and seeded flag; current scaling takes the state's recipe only.
// Shared by the normalization and activation bindings and by the layers'
// quantize_slot binding.
#ifndef FP8KIT_TORCH_EXT_FUSED_CAST_H_
#define FP8KIT_TORCH_EXT_FUSED_CAST_H_

#include <mutex>
#include <string>

#include "fp8kit/fused_cast.h"
#include "linear_state.h"
#include "torch_includes.h"

namespace fp8kit_torch {

// The LinearState behind a Python argument (TypeError naming `where`).
LinearState& read_linear_state(pybind11::handle state, const std::string& where);

// A slot index in [0, kSlots) (ValueError naming `where`).
int read_slot(pybind11::handle slot, const std::string& where);

// The cast arguments every fused binding takes, read and checked (each
// error names `fn` and the argument): the layer's state, the slot, whether
// this pass records, and the FP8 copies wanted (at least one).
struct CastArgs {
  LinearState* state;
  int slot;
  bool record;
  bool rowwise;
  bool columnwise;
};
CastArgs read_cast_args(const char* fn, pybind11::handle state, pybind11::handle slot,
                        pybind11::handle record, pybind11::handle rowwise,
                        pybind11::handle columnwise);
// The same checks on typed arguments (the dispatcher ops').
CastArgs check_cast_args(const char* fn, LinearState& state, int64_t slot, bool record,
                         bool rowwise, bool columnwise);

// One fused cast's FP8 outputs: the rowwise copy (the values' shape), the
// columnwise copy (columnwise_shape), either undefined when not wanted,
// and this cast's scalars (scale, scale_inv, amax at kScale / kScaleInv /
// kAmax), its own so that a saved copy's scale_inv never changes.
struct FusedCastOut {
  at::Tensor data, columnwise_data, scalars;
  // scale_inv as a one-element tensor (a view of `scalars`) for the GEMM.
  at::Tensor scale_inv() const { return scalars.narrow(0, kScaleInv, 1); }
};

// Allocates the outputs of a cast of values of `sizes` on `device` in the
// FP8 format of `slot`.
FusedCastOut alloc_fused_cast(const LinearState& st, int slot, at::IntArrayRef sizes,
                              bool rowwise, bool columnwise);

// Fills the descriptor of the FP8 output (`values` describes the float32
// tensor the op computes: its shape and device) and the cast of `slot`.
// Delayed scaling needs the state's lock held until the call has been
// made (finish_fused_cast after it).
void describe_fused_cast(LinearState& st, int slot, bool record, const FusedCastOut& out,
                         const fp8kit_tensor& values, fp8kit_tensor* out_desc,
                         fp8kit_fused_cast* cast);

// After a successful fused call: a recorded delayed cast leaves its slot
// seeded (the core has set the device flag; this is the host mirror).
void finish_fused_cast(LinearState& st, int slot, bool record);

// Column sums of a cast's values (the bias gradient) in `dtype`, with
// their workspace; the tile counters are the state's (caller holds its
// lock). sums.sums == NULL when not wanted.
struct ColumnSums {
  at::Tensor sums, partials;
  fp8kit_column_sums desc{};
};
ColumnSums alloc_column_sums(LinearState& st, int64_t rows, int64_t cols, at::ScalarType dtype);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_FUSED_CAST_H_
