// FFI handler for fp8kit_quantize_delayed_update: n tensors quantized with
// their delayed-scaling state, the state seeded and (record) updated in the
// same call, optionally the column sums of each input (a Linear's bias
// gradient). fp8kit/linear.h states the protocol; fp8kit.jax.dense calls
// this once per pass (x and kernel in forward, dy in backward).
//
// The state is a layer's whole DelayedScalingState: amax_history
// [slots, L], scale [slots], seeded [slots]; the n inputs use rows
// first_slot .. first_slot + n - 1, so the caller passes the state as it
// is (no slicing or scattering of rows around the call). The core updates
// those rows in place, so the Python side aliases the state inputs to the
// matching results (input_output_aliases); distinct buffers are copied
// first.
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

constexpr char kOp[] = "fp8kit_quantize_delayed_update";

using F32Buffer = ffi::Buffer<ffi::F32>;

// The state has `slots` rows (amax_history's); the n inputs use rows
// first_slot .. first_slot + n - 1; every other per-input operand has n.
ffi::Error CheckCounts(size_t slots, int64_t first_slot, size_t n, size_t scale, size_t seeded,
                       size_t amax, size_t inputs, size_t outputs, size_t flags) {
  const std::string want = std::to_string(n);
  if (scale != slots || seeded != slots) {
    return Invalid(kOp, "scale and seeded must hold " + std::to_string(slots) +
                            " entries, one per amax_history row (got " + std::to_string(scale) +
                            " and " + std::to_string(seeded) + ")");
  }
  if (first_slot < 0 || static_cast<size_t>(first_slot) + n > slots) {
    return Invalid(kOp, "first_slot " + std::to_string(first_slot) + " with " + want +
                            " inputs needs rows beyond the state's " + std::to_string(slots));
  }
  if (amax != 0 && amax != n) {
    return Invalid(kOp, "amax must hold " + want + " floats (one per input) or none");
  }
  if (inputs != n || outputs != 3 * n) {
    return Invalid(kOp, "expected " + want + " inputs and " + std::to_string(3 * n) +
                            " per-input results (data, columnwise_data, sums), got " +
                            std::to_string(inputs) + " and " + std::to_string(outputs));
  }
  if (flags != n) return Invalid(kOp, "rowwise, columnwise and sums must list " + want + " flags");
  return ffi::Error::Success();
}

ffi::Error QuantizeDelayedImpl(
    const Device& device, F32Buffer history_in, F32Buffer scale_in, F32Buffer seeded_in,
    F32Buffer amax_in, ffi::RemainingArgs inputs, ffi::Result<F32Buffer> history,
    ffi::Result<F32Buffer> scale, ffi::Result<F32Buffer> seeded,
    ffi::Result<F32Buffer> scale_inv, ffi::Result<ffi::AnyBuffer> workspace,
    ffi::RemainingRets outputs, bool record, int64_t first_slot, int32_t margin,
    int32_t amax_reduction,
    ffi::Span<const int32_t> rowwise, ffi::Span<const int32_t> columnwise,
    ffi::Span<const int32_t> sums) {
  const auto dims = history_in.dimensions();
  if (dims.size() != 2) return Invalid(kOp, "amax_history must be 2-D [n, history_len]");
  const size_t slots = static_cast<size_t>(dims[0]);
  const int64_t len = dims[1];
  const size_t n = inputs.size();
  if (auto err = CheckCounts(slots, first_slot, n, scale_in.element_count(),
                             seeded_in.element_count(), amax_in.element_count(), inputs.size(),
                             outputs.size(), rowwise.size());
      err.failure()) {
    return err;
  }
  if (columnwise.size() != n || sums.size() != n || scale_inv->element_count() != n) {
    return Invalid(kOp, "columnwise, sums and scale_inv must have one entry per input");
  }
  if (n == 0) return ffi::Error::Success();

  std::vector<fp8kit_tensor> in(n), out(n);
  std::vector<ffi::AnyBuffer> sum_buffers;
  std::vector<ScratchTensor> scratch(n);
  for (size_t i = 0; i < n; ++i) {
    auto x = inputs.get<ffi::AnyBuffer>(i);
    auto data = outputs.get<ffi::AnyBuffer>(3 * i);
    auto columnwise_data = outputs.get<ffi::AnyBuffer>(3 * i + 1);
    auto column_sums = outputs.get<ffi::AnyBuffer>(3 * i + 2);
    if (x.has_error()) return x.error();
    if (data.has_error()) return data.error();
    if (columnwise_data.has_error()) return columnwise_data.error();
    if (column_sums.has_error()) return column_sums.error();
    auto input = Describe(kOp, "an input", *x, device);
    if (input.has_error()) return input.error();
    auto output = DescribeFp8Output(kOp, *input, **data, **columnwise_data, rowwise[i] != 0,
                                    columnwise[i] != 0);
    if (output.has_error()) return output.error();
    output->scale_inv = scale_inv->typed_data() + i;
    in[i] = *input;
    out[i] = *output;
    View2d(x->dimensions(), &scratch[i].rows, &scratch[i].cols);
    scratch[i].sums = sums[i] != 0;
    sum_buffers.push_back(**column_sums);
  }

  const ScratchLayout layout(scratch, /*with_state=*/true);
  if (workspace->size_bytes() < layout.bytes()) {
    return Invalid(kOp, "the workspace result has " + std::to_string(workspace->size_bytes()) +
                            " bytes; this call needs " + std::to_string(layout.bytes()) +
                            " (fp8kit._jax_ext.workspace_bytes)");
  }
  void* base = workspace->untyped_data();
  for (auto [dst, src, bytes] :
       {std::tuple<void*, const void*, size_t>{history->untyped_data(), history_in.untyped_data(),
                                               history_in.size_bytes()},
        {scale->untyped_data(), scale_in.untyped_data(), scale_in.size_bytes()},
        {seeded->untyped_data(), seeded_in.untyped_data(), seeded_in.size_bytes()}}) {
    if (auto err = CopyIfDistinct(kOp, device, dst, src, bytes); err.failure()) return err;
  }
  if (auto err = ZeroBytes(kOp, device, base, layout.zeroed_bytes()); err.failure()) return err;

  std::vector<fp8kit_delayed_quantize_state> states(n);
  std::vector<fp8kit_column_sums> column_sums(n);
  bool any_sums = false;
  for (size_t i = 0; i < n; ++i) {
    const size_t row = static_cast<size_t>(first_slot) + i;
    states[i].amax_history = history->typed_data() + row * len;
    states[i].amax = layout.amax(base, i);
    states[i].scale = scale->typed_data() + row;
    states[i].scale_inv = layout.scale_inv(base, i);
    states[i].counter = layout.counter(base, i);
    states[i].seeded = seeded->typed_data() + row;
    column_sums[i] = fp8kit_column_sums{};
    if (!scratch[i].sums) continue;
    fp8kit_dtype sums_dtype;
    if (!ToFp8kitDtype(sum_buffers[i].element_type(), &sums_dtype) ||
        sum_buffers[i].element_count() != static_cast<size_t>(scratch[i].cols)) {
      return Invalid(kOp, "the column sums of input " + std::to_string(i) + " must be [" +
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
      if (auto err = CopyBytes(kOp, device, states[i].amax, amax_in.typed_data() + i,
                               sizeof(float));
          err.failure()) {
        return err;
      }
    }
  }
  fp8kit_delayed_scaling_config config;
  config.history_len = static_cast<int>(len);
  config.margin = margin;
  config.amax_reduction = static_cast<fp8kit_amax_reduction>(amax_reduction);
  return FromStatus(fp8kit_quantize_delayed_update(
      in.data(), out.data(), states.data(), any_sums ? column_sums.data() : nullptr,
      static_cast<int>(n), &config, record ? 1 : 0, device.stream));
}

template <typename Binding>
auto BindQuantizeDelayed(Binding binding) {
  return std::move(binding)
      .template Arg<F32Buffer>()   // amax_history: [slots, L], column 0 newest
      .template Arg<F32Buffer>()   // scale: [slots], each slot's scale
      .template Arg<F32Buffer>()   // seeded: [slots], 0 = unseeded (the first cast seeds it)
      .template Arg<F32Buffer>()   // amax: [n] global amaxes of sharded inputs, or (0,)
      .RemainingArgs()             // inputs: n float32/bfloat16/float16 tensors
      .template Ret<F32Buffer>()   // amax_history: [slots, L] (aliases the input)
      .template Ret<F32Buffer>()   // scale: [slots] the next scales (aliases the input)
      .template Ret<F32Buffer>()   // seeded: [slots] (aliases the input)
      .template Ret<F32Buffer>()   // scale_inv: [n], 1 / the scale each input was cast with
      .template Ret<ffi::AnyBuffer>()  // workspace: uint8, ScratchLayout's bytes
      .RemainingRets()             // per input: data, columnwise_data, column sums ((0,) if not)
      .template Attr<bool>("record")             // record: update the state (a gradient pass)
      .template Attr<int64_t>("first_slot")      // first_slot: the state row of input 0
      .template Attr<int32_t>("margin")          // margin: scale = fp8_max / amax / 2**margin
      .template Attr<int32_t>("amax_reduction")  // amax_reduction: fp8kit_amax_reduction code
      .template Attr<ffi::Span<const int32_t>>("rowwise")     // rowwise: [n] write data
      .template Attr<ffi::Span<const int32_t>>("columnwise")  // columnwise: [n] write the copy
      .template Attr<ffi::Span<const int32_t>>("sums");       // sums: [n] write column sums
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(quantize_delayed_update, fp8kit_jax::QuantizeDelayedImpl,
                   fp8kit_jax::BindQuantizeDelayed);
