// FFI handlers for fp8kit_quantize_delayed_update: n tensors quantized with
// their delayed-scaling state, optionally the column sums of each input (a
// Linear's bias gradient). fp8kit/linear.h states the protocol;
// fp8kit.jax.dense calls one of them per pass (x and kernel in forward, dy
// in backward). Two targets, by what the pass does with the state:
//   fp8kit_quantize_delayed_update  records (record = 1): the state comes
//       out updated. The core updates the rows in place, so the Python
//       side aliases the state inputs to the state results
//       (input_output_aliases); distinct buffers are copied first.
//   fp8kit_quantize_delayed         reads the state only (record = 0): a
//       pass that computes no gradient. No state results, so XLA neither
//       copies the state into them nor keeps a second one alive.
//
// The state is a layer's whole DelayedScalingState: amax_history
// [slots, L], scale [slots], seeded [slots]; the n inputs use rows
// first_slot .. first_slot + n - 1, so the caller passes the state as it
// is (no slicing or scattering of rows around the call). Each input's
// scale_inv is a result of its own (no slices of a shared array after the
// call).
//
// The core's amax accumulators and block counters live in the workspace
// result (scratch.h), zeroed here. When the caller passes amax [n] (the
// amax of each whole tensor, reduced across the devices sharing it), the
// accumulators start there instead, so a shard is cast, seeded and
// recorded with the global amax exactly as the unsharded call would.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ffi_helpers.h"
#include "handlers.h"
#include "scratch.h"

namespace fp8kit_jax {
namespace {

constexpr char kRecordOp[] = "fp8kit_quantize_delayed_update";
constexpr char kReadOp[] = "fp8kit_quantize_delayed";
// Results per input: data, columnwise_data, column sums, scale_inv.
constexpr size_t kPerInput = 4;

using F32Buffer = ffi::Buffer<ffi::F32>;

// The layer's whole state, as the core reads it (and, recording, writes it).
struct StateRows {
  float* history;  // [slots, len], column 0 newest
  float* scale;    // [slots]
  float* seeded;   // [slots]
  size_t slots;
  int64_t len;
};

// What both targets take as attributes besides `record`.
struct CallFlags {
  int64_t first_slot;
  int32_t margin;
  int32_t amax_reduction;
  ffi::Span<const int32_t> rowwise;
  ffi::Span<const int32_t> columnwise;
  ffi::Span<const int32_t> sums;
};

// The state has `slots` rows (amax_history's); the n inputs use rows
// first_slot .. first_slot + n - 1; every other per-input operand has n.
ffi::Error CheckCounts(const char* op, const StateRows& state, size_t scale, size_t seeded,
                       size_t amax, size_t n, size_t outputs, const CallFlags& f) {
  const std::string want = std::to_string(n);
  if (scale != state.slots || seeded != state.slots) {
    return Invalid(op, "scale and seeded must hold " + std::to_string(state.slots) +
                           " entries, one per amax_history row (got " + std::to_string(scale) +
                           " and " + std::to_string(seeded) + ")");
  }
  if (f.first_slot < 0 || static_cast<size_t>(f.first_slot) + n > state.slots) {
    return Invalid(op, "first_slot " + std::to_string(f.first_slot) + " with " + want +
                           " inputs needs rows beyond the state's " +
                           std::to_string(state.slots));
  }
  if (amax != 0 && amax != n) {
    return Invalid(op, "amax must hold " + want + " floats (one per input) or none");
  }
  if (outputs != kPerInput * n) {
    return Invalid(op, "expected " + std::to_string(kPerInput * n) +
                           " per-input results (data, columnwise_data, sums, scale_inv) for " +
                           want + " inputs, got " + std::to_string(outputs));
  }
  if (f.rowwise.size() != n || f.columnwise.size() != n || f.sums.size() != n) {
    return Invalid(op, "rowwise, columnwise and sums must list " + want + " flags");
  }
  return ffi::Error::Success();
}

// The shared body of both targets: describe the n inputs and their results,
// zero the workspace's accumulators, start them at the caller's amaxes, run
// the core with `record`.
ffi::Error Run(const char* op, const Device& device, const StateRows& state,
               F32Buffer amax_in, ffi::RemainingArgs inputs, ffi::AnyBuffer workspace,
               ffi::RemainingRets outputs, int record, const CallFlags& f) {
  const size_t n = inputs.size();
  std::vector<fp8kit_tensor> in(n), out(n);
  std::vector<ffi::AnyBuffer> sum_buffers;
  std::vector<ScratchTensor> scratch(n);
  for (size_t i = 0; i < n; ++i) {
    auto x = inputs.get<ffi::AnyBuffer>(i);
    auto data = outputs.get<ffi::AnyBuffer>(kPerInput * i);
    auto columnwise_data = outputs.get<ffi::AnyBuffer>(kPerInput * i + 1);
    auto column_sums = outputs.get<ffi::AnyBuffer>(kPerInput * i + 2);
    auto scale_inv = outputs.get<F32Buffer>(kPerInput * i + 3);
    if (x.has_error()) return x.error();
    if (data.has_error()) return data.error();
    if (columnwise_data.has_error()) return columnwise_data.error();
    if (column_sums.has_error()) return column_sums.error();
    if (scale_inv.has_error()) return scale_inv.error();
    if ((*scale_inv)->element_count() != 1) {
      return Invalid(op, "the scale_inv result of input " + std::to_string(i) +
                             " must be one float32");
    }
    auto input = Describe(op, "an input", *x, device);
    if (input.has_error()) return input.error();
    auto output = DescribeFp8Output(op, *input, **data, **columnwise_data, f.rowwise[i] != 0,
                                    f.columnwise[i] != 0);
    if (output.has_error()) return output.error();
    output->scale_inv = (*scale_inv)->typed_data();
    in[i] = *input;
    out[i] = *output;
    View2d(x->dimensions(), &scratch[i].rows, &scratch[i].cols);
    scratch[i].sums = f.sums[i] != 0;
    sum_buffers.push_back(**column_sums);
  }

  const ScratchLayout layout(scratch, /*with_state=*/true);
  if (workspace.size_bytes() < layout.bytes()) {
    return Invalid(op, "the workspace result has " + std::to_string(workspace.size_bytes()) +
                           " bytes; this call needs " + std::to_string(layout.bytes()) +
                           " (fp8kit._jax_ext.workspace_bytes)");
  }
  void* base = workspace.untyped_data();
  if (auto err = ZeroBytes(op, device, base, layout.zeroed_bytes()); err.failure()) return err;

  std::vector<fp8kit_delayed_quantize_state> states(n);
  std::vector<fp8kit_column_sums> column_sums(n);
  bool any_sums = false;
  for (size_t i = 0; i < n; ++i) {
    const size_t row = static_cast<size_t>(f.first_slot) + i;
    states[i].amax_history = state.history + row * state.len;
    states[i].amax = layout.amax(base, i);
    states[i].scale = state.scale + row;
    states[i].scale_inv = layout.scale_inv(base, i);
    states[i].counter = layout.counter(base, i);
    states[i].seeded = state.seeded + row;
    column_sums[i] = fp8kit_column_sums{};
    if (!scratch[i].sums) continue;
    fp8kit_dtype sums_dtype;
    if (!ToFp8kitDtype(sum_buffers[i].element_type(), &sums_dtype) ||
        sum_buffers[i].element_count() != static_cast<size_t>(scratch[i].cols)) {
      return Invalid(op, "the column sums of input " + std::to_string(i) + " must be [" +
                             std::to_string(scratch[i].cols) +
                             "] float32, bfloat16 or float16");
    }
    column_sums[i].sums = sum_buffers[i].untyped_data();
    column_sums[i].dtype = sums_dtype;
    column_sums[i].partials = layout.sum_partials(base, i);
    column_sums[i].counters = layout.sum_counters(base, i);
    any_sums = true;
  }
  // The accumulators start at the caller's reduced amaxes (sharded inputs).
  if (amax_in.element_count() == n) {
    for (size_t i = 0; i < n; ++i) {
      if (auto err = CopyBytes(op, device, states[i].amax, amax_in.typed_data() + i,
                               sizeof(float));
          err.failure()) {
        return err;
      }
    }
  }
  fp8kit_delayed_scaling_config config;
  config.amax_history_len = static_cast<int>(state.len);
  config.margin = f.margin;
  config.amax_reduction = static_cast<fp8kit_amax_reduction>(f.amax_reduction);
  return FromStatus(fp8kit_quantize_delayed_update(
      in.data(), out.data(), states.data(), any_sums ? column_sums.data() : nullptr,
      static_cast<int>(n), &config, record, device.stream));
}

// The state's rows from amax_history's shape, checked with the rest.
ffi::Error Rows(const char* op, F32Buffer history, F32Buffer scale, F32Buffer seeded,
                F32Buffer amax, size_t n, size_t outputs, const CallFlags& f, StateRows* rows) {
  const auto dims = history.dimensions();
  if (dims.size() != 2) return Invalid(op, "amax_history must be 2-D [slots, amax_history_len]");
  *rows = StateRows{history.typed_data(), scale.typed_data(), seeded.typed_data(),
                    static_cast<size_t>(dims[0]), dims[1]};
  return CheckCounts(op, *rows, scale.element_count(), seeded.element_count(),
                     amax.element_count(), n, outputs, f);
}

// Recording: the state results alias the state inputs (copied first when
// XLA gave distinct buffers); the core updates their rows in place.
ffi::Error QuantizeDelayedUpdateImpl(
    const Device& device, F32Buffer history_in, F32Buffer scale_in, F32Buffer seeded_in,
    F32Buffer amax_in, ffi::RemainingArgs inputs, ffi::Result<F32Buffer> history,
    ffi::Result<F32Buffer> scale, ffi::Result<F32Buffer> seeded,
    ffi::Result<ffi::AnyBuffer> workspace, ffi::RemainingRets outputs, int64_t first_slot,
    int32_t margin, int32_t amax_reduction, ffi::Span<const int32_t> rowwise,
    ffi::Span<const int32_t> columnwise, ffi::Span<const int32_t> sums) {
  const CallFlags f{first_slot, margin, amax_reduction, rowwise, columnwise, sums};
  StateRows rows;
  if (auto err = Rows(kRecordOp, history_in, scale_in, seeded_in, amax_in, inputs.size(),
                      outputs.size(), f, &rows);
      err.failure()) {
    return err;
  }
  if (inputs.size() == 0) return ffi::Error::Success();
  for (auto [dst, src, bytes] :
       {std::tuple<void*, const void*, size_t>{history->untyped_data(), history_in.untyped_data(),
                                               history_in.size_bytes()},
        {scale->untyped_data(), scale_in.untyped_data(), scale_in.size_bytes()},
        {seeded->untyped_data(), seeded_in.untyped_data(), seeded_in.size_bytes()}}) {
    if (auto err = CopyIfDistinct(kRecordOp, device, dst, src, bytes); err.failure()) return err;
  }
  rows.history = history->typed_data();
  rows.scale = scale->typed_data();
  rows.seeded = seeded->typed_data();
  return Run(kRecordOp, device, rows, amax_in, inputs, *workspace, outputs, /*record=*/1, f);
}

// Reading: record = 0, under which the core writes none of history, scale
// and seeded, so it is given the input buffers themselves.
ffi::Error QuantizeDelayedImpl(const Device& device, F32Buffer history, F32Buffer scale,
                               F32Buffer seeded, F32Buffer amax_in, ffi::RemainingArgs inputs,
                               ffi::Result<ffi::AnyBuffer> workspace, ffi::RemainingRets outputs,
                               int64_t first_slot, int32_t margin, int32_t amax_reduction,
                               ffi::Span<const int32_t> rowwise,
                               ffi::Span<const int32_t> columnwise,
                               ffi::Span<const int32_t> sums) {
  const CallFlags f{first_slot, margin, amax_reduction, rowwise, columnwise, sums};
  StateRows rows;
  if (auto err = Rows(kReadOp, history, scale, seeded, amax_in, inputs.size(), outputs.size(), f,
                      &rows);
      err.failure()) {
    return err;
  }
  if (inputs.size() == 0) return ffi::Error::Success();
  return Run(kReadOp, device, rows, amax_in, inputs, *workspace, outputs, /*record=*/0, f);
}

// The operands both targets share after their state results.
template <typename Binding>
auto BindCallOperands(Binding&& binding) {
  return std::move(binding)
      .template Ret<ffi::AnyBuffer>()  // workspace: uint8, ScratchLayout's bytes
      .RemainingRets()  // per input: data, columnwise_data, column sums ((0,) if not), scale_inv
      .template Attr<int64_t>("first_slot")      // first_slot: the state row of input 0
      .template Attr<int32_t>("margin")          // margin: scale = fp8_max / amax / 2**margin
      .template Attr<int32_t>("amax_reduction")  // amax_reduction: fp8kit_amax_reduction code
      .template Attr<ffi::Span<const int32_t>>("rowwise")     // rowwise: [n] write data
      .template Attr<ffi::Span<const int32_t>>("columnwise")  // columnwise: [n] write the copy
      .template Attr<ffi::Span<const int32_t>>("sums");       // sums: [n] write column sums
}

template <typename Binding>
auto BindStateInputs(Binding&& binding) {
  return std::move(binding)
      .template Arg<F32Buffer>()  // amax_history: [slots, L], column 0 newest
      .template Arg<F32Buffer>()  // scale: [slots], each slot's scale
      .template Arg<F32Buffer>()  // seeded: [slots], 0 = unseeded (the first cast seeds it)
      .template Arg<F32Buffer>()  // amax: [n] global amaxes of sharded inputs, or (0,)
      .RemainingArgs();           // inputs: n float32/bfloat16/float16 tensors
}

template <typename Binding>
auto BindQuantizeDelayedUpdate(Binding binding) {
  return BindCallOperands(BindStateInputs(std::move(binding))
                              .template Ret<F32Buffer>()   // amax_history (aliases the input)
                              .template Ret<F32Buffer>()   // scale: the next scales (aliased)
                              .template Ret<F32Buffer>());  // seeded (aliases the input)
}

template <typename Binding>
auto BindQuantizeDelayed(Binding binding) {
  return BindCallOperands(BindStateInputs(std::move(binding)));
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(quantize_delayed_update, fp8kit_jax::QuantizeDelayedUpdateImpl,
                   fp8kit_jax::BindQuantizeDelayedUpdate);
FP8KIT_JAX_HANDLER(quantize_delayed, fp8kit_jax::QuantizeDelayedImpl,
                   fp8kit_jax::BindQuantizeDelayed);
