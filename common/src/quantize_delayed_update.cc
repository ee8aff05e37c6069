// fp8kit_quantize_delayed_update: validation, then the CPU reference
// (quantize, then the delayed-scaling update, per tensor) or the grouped
// CUDA kernels (common/cuda/quantize_fused.cu).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "column_sums.h"
#include "compute_scale.h"
#include "delayed_scaling_cpu.h"
#include "element_load.h"
#include "error.h"
#include "float_bits.h"
#include "fp8kit/delayed_scaling.h"
#include "quantize_cpu.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

constexpr const char* kOp = "quantize_delayed_update";
constexpr int kMaxCount = 64;

// Entry i of `sums` (NULL: no column sums anywhere).
const fp8kit_column_sums* sums_of(const fp8kit_column_sums* sums, int i) {
  return sums != nullptr && sums[i].sums != nullptr ? &sums[i] : nullptr;
}

void check_sums(const fp8kit_tensor& input, const fp8kit_tensor& output,
                const fp8kit_column_sums& s, int i) {
  FP8KIT_CHECK(s.dtype == FP8KIT_FLOAT32 || s.dtype == FP8KIT_BFLOAT16 ||
                   s.dtype == FP8KIT_FLOAT16,
               kOp, ": sums[", i, "].dtype is ", fp8kit_dtype_name(s.dtype),
               "; column sums are float32, bfloat16 or float16");
  FP8KIT_CHECK(s.partials != nullptr && s.counters != nullptr, kOp, ": sums[", i,
               "] has a NULL partials or counters; both are required (partials: "
               "fp8kit_column_sums_workspace(rows, cols) floats, counters: ceil(cols / 128) "
               "zeros)");
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  FP8KIT_CHECK(output.columnwise_data != nullptr && rows > 1 && cols > 1, kOp, ": sums[", i,
               "] asks for column sums of inputs[", i, "] (", shape_string(input),
               "), which the cast+transpose pass computes: it needs outputs[", i,
               "].columnwise_data and a 2-D view with rows > 1 and cols > 1; sum the other "
               "tensors separately");
}

void check_args(const fp8kit_tensor* inputs, const fp8kit_tensor* outputs,
                const fp8kit_delayed_quantize_state* states, const fp8kit_column_sums* sums,
                int count, const fp8kit_delayed_scaling_config* config) {
  FP8KIT_CHECK(count >= 0 && count <= kMaxCount, kOp, ": count is ", count,
               "; pass 0..", kMaxCount, " tensors per call");
  FP8KIT_CHECK(count == 0 || (inputs != nullptr && outputs != nullptr && states != nullptr), kOp,
               ": inputs, outputs and states must each be an array of count (", count,
               ") entries");
  check_delayed_scaling_config(kOp, config);
  for (int i = 0; i < count; ++i) {
    const fp8kit_delayed_quantize_state& s = states[i];
    FP8KIT_CHECK(s.amax_history != nullptr && s.amax != nullptr && s.scale != nullptr &&
                     s.scale_inv != nullptr && s.counter != nullptr,
                 kOp, ": states[", i, "] has a NULL pointer; amax_history, amax, scale, "
                 "scale_inv and counter are all required");
    FP8KIT_CHECK(s.amax < s.amax_history || s.amax >= s.amax_history + config->history_len, kOp,
                 ": states[", i, "].amax points into its amax_history; the amax accumulator "
                 "needs a float of its own");
    FP8KIT_CHECK(outputs[i].scale == nullptr && outputs[i].amax == nullptr, kOp, ": outputs[", i,
                 "] has scale or amax set; leave them NULL (the scale is read from and the amax "
                 "accumulated into states[", i, "])");
    // Every other output field exactly as fp8kit_quantize checks it.
    fp8kit_tensor out = outputs[i];
    out.scale = s.scale;
    check_quantize_args(kOp, &inputs[i], &out, /*current_scaling=*/false);
    for (int j = 0; j < i; ++j) {
      FP8KIT_CHECK(states[j].amax_history != s.amax_history && states[j].amax != s.amax &&
                       states[j].counter != s.counter && states[j].scale != s.scale,
                   kOp, ": states[", j, "] and states[", i, "] share buffers; each tensor of a "
                   "call needs its own state");
    }
    FP8KIT_CHECK(inputs[i].device_type == inputs[0].device_type &&
                     inputs[i].device_index == inputs[0].device_index,
                 kOp, ": inputs[", i, "] is on another device than inputs[0]; one call runs on "
                 "one device");
    if (const fp8kit_column_sums* cs = sums_of(sums, i)) check_sums(inputs[i], outputs[i], *cs, i);
  }
}

template <typename Load>
void column_sums_typed(const void* in, int64_t rows, int64_t cols, const fp8kit_column_sums& s) {
  std::vector<float> total(size_t(cols), 0.0f);
  for (int64_t t0 = 0; t0 < rows; t0 += kSumTileRows) {
    for (int64_t c = 0; c < cols; ++c) {
      float tile = 0.0f;
      for (int64_t g0 = t0; g0 < t0 + kSumTileRows; g0 += kSumGroupRows) {
        float group = 0.0f;
        for (int64_t r = g0; r < g0 + kSumGroupRows; ++r) {
          group = add_rn(group, r < rows ? Load::load(in, r * cols + c) : 0.0f);
        }
        tile = add_rn(tile, group);
      }
      total[size_t(c)] = add_rn(total[size_t(c)], tile);
    }
  }
  for (int64_t c = 0; c < cols; ++c) store_column_sum(s.sums, s.dtype, c, total[size_t(c)]);
}

// The CPU reference of fp8kit_column_sums, in its documented order.
void column_sums_cpu(const fp8kit_tensor& input, const fp8kit_column_sums& s) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  switch (input.dtype) {
    case FP8KIT_FLOAT32: column_sums_typed<LoadF32>(input.data, rows, cols, s); break;
    case FP8KIT_BFLOAT16: column_sums_typed<LoadBF16>(input.data, rows, cols, s); break;
    default: column_sums_typed<LoadF16>(input.data, rows, cols, s); break;
  }
}

// The accumulator after the CUDA kernels' atomicMax on float bits: the
// entry value's bits as they are, each block's max |x| with NaN made the
// canonical 0x7FC00000 (amax_block_commit in quantize_device.cuh).
float accumulate_amax(float entry, float x_amax) {
  uint32_t x_bits = float_to_bits(x_amax) & 0x7fffffffu;
  if (x_bits > 0x7f800000u) x_bits = 0x7fc00000u;
  return bits_to_float(std::max(float_to_bits(entry), x_bits));
}

void quantize_delayed_update_cpu(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                                 const fp8kit_delayed_quantize_state* states,
                                 const fp8kit_column_sums* sums, int count,
                                 const fp8kit_delayed_scaling_config& config) {
  for (int i = 0; i < count; ++i) {
    if (const fp8kit_column_sums* cs = sums_of(sums, i)) column_sums_cpu(inputs[i], *cs);
    const fp8kit_delayed_quantize_state& s = states[i];
    fp8kit_tensor& out = outputs[i];
    const float scale = *s.scale;
    const float x_amax = quantize_cpu(inputs[i], scale, out.dtype, static_cast<uint8_t*>(out.data),
                                      static_cast<uint8_t*>(out.columnwise_data));
    if (out.scale_inv != nullptr) *out.scale_inv = reciprocal(scale);
    const float newest = accumulate_amax(*s.amax, x_amax);
    const fp8kit_delayed_scaling_state update{s.amax_history, &newest, s.scale, s.scale_inv,
                                              out.dtype};
    delayed_scaling_update_cpu(&update, 1, config);
    *s.amax = 0.0f;
    *s.counter = 0;
  }
}

}  // namespace
}  // namespace fp8kit

extern "C" int64_t fp8kit_column_sums_workspace(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return (rows + fp8kit::kSumTileRows - 1) / fp8kit::kSumTileRows * cols;
}

extern "C" fp8kit_status fp8kit_quantize_delayed_update_sums(
    const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
    const fp8kit_delayed_quantize_state* states, const fp8kit_column_sums* sums, int count,
    const fp8kit_delayed_scaling_config* config, void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_args(inputs, outputs, states, sums, count, config);
    if (count == 0) return;
    if (inputs[0].device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_delayed_update_cpu(inputs, outputs, states, sums, count, *config);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize_delayed_update(inputs, outputs, states, sums, count, *config,
                                            stream);
#endif
    }
    (void)stream;
  });
}

extern "C" fp8kit_status fp8kit_quantize_delayed_update(
    const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
    const fp8kit_delayed_quantize_state* states, int count,
    const fp8kit_delayed_scaling_config* config, void* stream) {
  return fp8kit_quantize_delayed_update_sums(inputs, outputs, states, nullptr, count, config,
                                             stream);
}
