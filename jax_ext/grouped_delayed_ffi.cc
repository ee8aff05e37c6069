// FFI handler for fp8kit_grouped_quantize_delayed_update (fp8kit/grouped.h):
// the delayed-scaling cast of a token-grouped [T, F] with one scaling
// state per group, for fp8kit.jax.grouped_dense.
//
// Functional, as XLA needs: the state arrives as arguments (amax_history
// [E, len], scale and seeded [E, FP8KIT_GROUP_SCALE_STRIDE], group g's in
// column 0) and leaves as results, which fp8kit.jax aliases to the
// arguments so that no copy is made when XLA can reuse their buffers
// (CopyIfDistinct). Uncaptured like the other grouped handlers
// (grouped_ffi.cc): the core reads the group sizes on the host.
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "fp8kit/grouped.h"
#include "grouped_ffi.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_grouped_quantize_delayed";

ffi::Error GroupedQuantizeDelayedImpl(
    const Device& device, ffi::AnyBuffer x, ffi::AnyBuffer group_sizes,
    ffi::AnyBuffer amax_history, ffi::AnyBuffer scale, ffi::AnyBuffer seeded,
    ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> columnwise,
    ffi::Result<ffi::AnyBuffer> scale_used, ffi::Result<ffi::AnyBuffer> scale_inv,
    ffi::Result<ffi::AnyBuffer> amax, ffi::Result<ffi::AnyBuffer> new_history,
    ffi::Result<ffi::AnyBuffer> new_scale, ffi::Result<ffi::AnyBuffer> new_seeded, bool rowwise,
    bool want_columnwise, int32_t margin, int32_t amax_reduction, bool record) {
  auto input = Describe(kOp, "x", x, device);
  if (input.has_error()) return input.error();
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kOp, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  const std::pair<const char*, ffi::AnyBuffer> scales[] = {
      {"scale", scale},
      {"seeded", seeded},
      {"the scale result", *scale_used},
      {"the scale_inv result", *scale_inv},
      {"the amax result", *amax},
      {"the new scale result", *new_scale},
      {"the new seeded result", *new_seeded}};
  for (const auto& [arg, buf] : scales) {
    if (auto err = CheckGroupScales(kOp, arg, buf, groups); err.failure()) return err;
  }
  const auto h = amax_history.dimensions();
  if (amax_history.element_type() != ffi::DataType::F32 || h.size() != 2 || h[0] != groups ||
      h[1] < 1 || new_history->element_type() != ffi::DataType::F32 ||
      new_history->dimensions().size() != 2 || new_history->dimensions()[0] != h[0] ||
      new_history->dimensions()[1] != h[1]) {
    return Invalid(kOp, "amax_history and its result must be float32 [" +
                            std::to_string(groups) + ", amax_history_len] (one row per group)");
  }
  auto output = DescribeGroupedOutput(kOp, *input, groups, *data, *columnwise, rowwise,
                                      want_columnwise);
  if (output.has_error()) return output.error();
  const size_t scale_bytes = static_cast<size_t>(groups * kStride) * sizeof(float);
  const std::pair<void*, const void*> state[] = {
      {new_history->untyped_data(), amax_history.untyped_data()},
      {new_scale->untyped_data(), scale.untyped_data()},
      {new_seeded->untyped_data(), seeded.untyped_data()}};
  const size_t state_bytes[] = {static_cast<size_t>(h[0] * h[1]) * sizeof(float), scale_bytes,
                                scale_bytes};
  for (int i = 0; i < 3; ++i) {
    if (auto err = CopyIfDistinct(kOp, device, state[i].first, state[i].second, state_bytes[i]);
        err.failure()) {
      return err;
    }
  }
  // The core writes column 0 of each scale row; the rest is zeroed so that
  // every result element is defined.
  for (void* p : {scale_used->untyped_data(), scale_inv->untyped_data(), amax->untyped_data()}) {
    if (auto err = ZeroBytes(kOp, device, p, scale_bytes); err.failure()) return err;
  }
  output->scale = static_cast<float*>(scale_used->untyped_data());
  output->scale_inv = static_cast<float*>(scale_inv->untyped_data());
  output->amax = static_cast<float*>(amax->untyped_data());
  const fp8kit_grouped_delayed_state core_state{static_cast<float*>(new_history->untyped_data()),
                                                static_cast<float*>(new_scale->untyped_data()),
                                                static_cast<float*>(new_seeded->untyped_data())};
  const fp8kit_delayed_scaling_config config{static_cast<int>(h[1]), margin,
                                             static_cast<fp8kit_amax_reduction>(amax_reduction)};
  return FromStatus(fp8kit_grouped_quantize_delayed_update(
      &*input, &*sizes, &*output, &core_state, &config, record ? 1 : 0, device.stream));
}

template <typename Binding>
auto BindGroupedQuantizeDelayed(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // x: [T, F] float32/bfloat16/float16, by group
      .template Arg<ffi::AnyBuffer>()          // group_sizes: int64 [E] or int32 [E, 2]
      .template Arg<ffi::AnyBuffer>()          // amax_history: float32 [E, len], column 0 newest
      .template Arg<ffi::AnyBuffer>()          // scale: float32 [E, 4], each group's next scale
      .template Arg<ffi::AnyBuffer>()          // seeded: float32 [E, 4], 0 fresh, 1 seeded
      .template Ret<ffi::AnyBuffer>()          // data: FP8 [T, F] (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()          // columnwise: FP8, the flat grouped copy (or (0,))
      .template Ret<ffi::AnyBuffer>()          // scale: float32 [E, 4], the scales cast with
      .template Ret<ffi::AnyBuffer>()          // scale_inv: float32 [E, 4], their reciprocals
      .template Ret<ffi::AnyBuffer>()          // amax: float32 [E, 4], each group's max |x|
      .template Ret<ffi::AnyBuffer>()          // amax_history: the state's after the call
      .template Ret<ffi::AnyBuffer>()          // scale: the state's after the call
      .template Ret<ffi::AnyBuffer>()          // seeded: the state's after the call
      .template Attr<bool>("rowwise")          // rowwise: write `data`
      .template Attr<bool>("columnwise")       // columnwise: write `columnwise`
      .template Attr<int32_t>("margin")        // margin: scale = fp8_max / amax / 2**margin
      .template Attr<int32_t>("amax_reduction")  // amax_reduction: fp8kit_amax_reduction code
      .template Attr<bool>("record");          // record: roll the amaxes in, rescale, seed
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_quantize_delayed, fp8kit_jax::GroupedQuantizeDelayedImpl,
                              fp8kit_jax::BindGroupedQuantizeDelayed);
