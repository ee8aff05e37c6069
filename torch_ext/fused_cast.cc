#include "fused_cast.h"

#include <cstring>

#include "descriptors.h"
#include "errors.h"
#include "initialised.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {

LinearState& read_linear_state(py::handle state, const std::string& where) {
  FP8KIT_TYPE_CHECK(is_instance_of(state, typeid(LinearState)), where, " is ", value_str(state),
                    "; it must be an fp8kit._torch_ext.LinearState (LinearState(recipe, device), "
                    "or a layer's fp8_state)");
  static constexpr ClassHint kHint{"fp8kit._torch_ext.LinearState",
                                   "LinearState(recipe, device)"};
  return initialised<LinearState>(state, kHint);
}

int read_slot(py::handle slot, const std::string& where) {
  return read_int(slot, where, 0, kSlots - 1);
}

CastArgs read_cast_args(const char* fn, py::handle state, py::handle slot, py::handle record,
                        py::handle rowwise, py::handle columnwise) {
  LinearState& st = read_linear_state(state, c10::str(fn, ": state"));
  const int s = read_slot(slot, c10::str(fn, ": slot"));
  return check_cast_args(fn, st, s, read_bool(record, c10::str(fn, ": record")),
                         read_bool(rowwise, c10::str(fn, ": rowwise")),
                         read_bool(columnwise, c10::str(fn, ": columnwise")));
}

CastArgs check_cast_args(const char* fn, LinearState& state, int64_t slot, bool record,
                         bool rowwise, bool columnwise) {
  FP8KIT_VALUE_CHECK(slot >= 0 && slot < kSlots, fn, ": slot is ", slot, "; it must be in [0, ",
                     kSlots - 1, "] (0 input, 1 weight, 2 grad_output)");
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; ask for at least one FP8 copy");
  return CastArgs{&state, static_cast<int>(slot), record, rowwise, columnwise};
}

FusedCastOut alloc_fused_cast(const LinearState& st, int slot, at::IntArrayRef sizes,
                              bool rowwise, bool columnwise) {
  const auto opts = at::TensorOptions().device(st.device);
  const auto fp8 = opts.dtype(torch_fp8_type(st.slot_dtype(slot)));
  FusedCastOut out;
  if (rowwise) out.data = at::empty(sizes, fp8);
  if (columnwise) out.columnwise_data = at::empty(columnwise_shape(sizes), fp8);
  out.scalars = at::empty({kScalars}, opts.dtype(at::kFloat));
  return out;
}

void describe_fused_cast(LinearState& st, int slot, bool record, const FusedCastOut& out,
                         const fp8kit_tensor& values, fp8kit_tensor* d, fp8kit_fused_cast* cast) {
  *d = values;
  d->dtype = st.slot_dtype(slot);
  d->scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  d->data = out.data.defined() ? out.data.data_ptr() : nullptr;
  d->columnwise_data = out.columnwise_data.defined() ? out.columnwise_data.data_ptr() : nullptr;
  float* scalars = out.scalars.data_ptr<float>();
  d->scale_inv = scalars + kScaleInv;
  std::memset(cast, 0, sizeof(*cast));
  const LinearRecipe& r = st.recipe;
  if (!r.delayed) {
    d->scale = scalars + kScale;
    d->amax = scalars + kAmax;
    cast->recipe = FP8KIT_FUSED_CAST_CURRENT;
    cast->current_config.amax_epsilon = r.amax_epsilon;
    cast->current_config.power_2_scale = r.power_2_scale ? 1 : 0;
    return;
  }
  d->scale = nullptr;  // the state holds scale and amax
  d->amax = nullptr;
  cast->recipe = FP8KIT_FUSED_CAST_DELAYED;
  fp8kit_delayed_quantize_state& s = cast->state;
  s.amax_history = st.history.data_ptr<float>() + slot * r.amax_history_len;
  s.amax = st.amax.data_ptr<float>() + slot;
  s.scale = st.scale.data_ptr<float>() + slot;
  s.scale_inv = st.scale_inv.data_ptr<float>() + slot;
  s.counter = reinterpret_cast<unsigned int*>(st.counters.data_ptr<int32_t>()) + slot;
  // Passed only while unseeded: a seeded slot is spared the seeding pass.
  s.seeded = st.seeded[slot] ? nullptr : st.seeded_flags.data_ptr<float>() + slot;
  cast->delayed_config.amax_history_len = r.amax_history_len;
  cast->delayed_config.margin = r.margin;
  cast->delayed_config.amax_reduction = r.amax_reduction;
  cast->record = record ? 1 : 0;
}

void finish_fused_cast(LinearState& st, int slot, bool record) {
  if (st.recipe.delayed && record) st.seeded[slot] = true;
}

ColumnSums alloc_column_sums(LinearState& st, int64_t rows, int64_t cols, at::ScalarType dtype) {
  ColumnSums c;
  const auto opts = at::TensorOptions().device(st.device);
  c.sums = at::empty({cols}, opts.dtype(dtype));
  c.partials = at::empty({fp8kit_column_sums_workspace(rows, cols)}, opts.dtype(at::kFloat));
  c.desc.sums = c.sums.data_ptr();
  c.desc.dtype = *high_precision_dtype(dtype);
  c.desc.partials = c.partials.data_ptr<float>();
  c.desc.counters = st.sum_counters_for(cols);
  return c;
}

}  // namespace fp8kit_torch
