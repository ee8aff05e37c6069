// fp8kit_quantize_delayed_update: validation, then the CPU reference
// (seed scale, quantize, column sums, then the delayed-scaling update, per
// tensor) or the grouped CUDA kernels (common/cuda/quantize_fused.cu).
#include <algorithm>
#include <cstdint>
#include <string>

#include "amax_cpu.h"
#include "column_sums_cpu.h"
#include "compute_scale.h"
#include "delayed_scaling_cpu.h"
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
    check_delayed_quantize_state(kOp, ("states[" + std::to_string(i) + "]").c_str(), s, *config);
    FP8KIT_CHECK(outputs[i].scale == nullptr && outputs[i].amax == nullptr, kOp, ": outputs[", i,
                 "] has scale or amax set; leave them NULL (the scale is read from and the amax "
                 "accumulated into states[", i, "])");
    // Every other output field exactly as fp8kit_quantize checks it.
    fp8kit_tensor out = outputs[i];
    out.scale = s.scale;
    check_quantize_args(kOp, &inputs[i], &out, /*current_scaling=*/false);
    for (int j = 0; j < i; ++j) {
      FP8KIT_CHECK(states[j].amax_history != s.amax_history && states[j].amax != s.amax &&
                       states[j].counter != s.counter && states[j].scale != s.scale &&
                       (s.seeded == nullptr || states[j].seeded != s.seeded),
                   kOp, ": states[", j, "] and states[", i, "] share buffers; each tensor of a "
                   "call needs its own state");
    }
    FP8KIT_CHECK(inputs[i].device_type == inputs[0].device_type &&
                     inputs[i].device_index == inputs[0].device_index,
                 kOp, ": inputs[", i, "] is on another device than inputs[0]; one call runs on "
                 "one device");
    if (const fp8kit_column_sums* cs = sums_of(sums, i)) {
      const std::string at = "[" + std::to_string(i) + "]";
      check_column_sums(kOp, "sums" + at, "inputs" + at, "outputs" + at + ".columnwise_data",
                        inputs[i], outputs[i], *cs);
    }
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

}  // namespace

void quantize_delayed_update_cpu(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                                 const fp8kit_delayed_quantize_state* states,
                                 const fp8kit_column_sums* sums, int count,
                                 const fp8kit_delayed_scaling_config& config, bool record) {
  for (int i = 0; i < count; ++i) {
    const fp8kit_delayed_quantize_state& s = states[i];
    fp8kit_tensor& out = outputs[i];
    const bool fresh = s.seeded != nullptr && *s.seeded == 0.0f;
    // A fresh slot's seed: the update's rule applied to this amax alone,
    // which the cast needs before it runs (otherwise the cast measures it).
    // Then the policy for a bad scale (fp8kit/quantize.h).
    const float scale = checked_scale(
        fresh ? delayed_scale_from_amax(accumulate_amax(*s.amax, amax_cpu(inputs[i])), *s.scale,
                                        fp8kit_fp8_max(out.dtype), config.margin)
              : *s.scale);
    const float x_amax = quantize_cpu(inputs[i], scale, out.dtype, static_cast<uint8_t*>(out.data),
                                      static_cast<uint8_t*>(out.columnwise_data));
    if (out.scale_inv != nullptr) *out.scale_inv = reciprocal(scale);
    if (const fp8kit_column_sums* cs = sums_of(sums, i)) column_sums_cpu(inputs[i], *cs);
    if (record) {
      const float newest = accumulate_amax(*s.amax, x_amax);
      *s.scale = scale;  // the previous scale of the update: the one used
      const fp8kit_delayed_scaling_state update{s.amax_history, &newest, s.scale, s.scale_inv,
                                                out.dtype};
      delayed_scaling_update_cpu(&update, 1, config);
      if (s.seeded != nullptr) *s.seeded = 1.0f;
    }
    *s.amax = 0.0f;
    *s.counter = 0;
  }
}

}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_quantize_delayed_update(
    const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
    const fp8kit_delayed_quantize_state* states, const fp8kit_column_sums* sums, int count,
    const fp8kit_delayed_scaling_config* config, int record, void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_args(inputs, outputs, states, sums, count, config);
    if (count == 0) return;
    if (inputs[0].device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_delayed_update_cpu(inputs, outputs, states, sums, count, *config,
                                          record != 0);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize_delayed_update(inputs, outputs, states, sums, count, *config,
                                            record != 0, stream);
#endif
    }
    (void)stream;
  });
}
