#include "delayed_scaling_cpu.h"

#include "compute_scale.h"

namespace fp8kit {

void delayed_scaling_update_cpu(const fp8kit_delayed_scaling_state* states, int count,
                                const fp8kit_delayed_scaling_config& config) {
  const int len = config.amax_history_len;
  for (int s = 0; s < count; ++s) {
    const fp8kit_delayed_scaling_state& st = states[s];
    float* h = st.amax_history;
    const float newest = *st.amax;  // read first: amax may alias the history
    for (int i = len - 1; i > 0; --i) h[i] = h[i - 1];
    h[0] = newest;
    float reduced = h[0];
    if (config.amax_reduction == FP8KIT_AMAX_MAX) {
      for (int i = 1; i < len; ++i) reduced = max_nan(reduced, h[i]);
    }
    const float scale = delayed_scale_from_amax(reduced, *st.scale,
                                                fp8kit_fp8_max(st.fp8_dtype), config.margin);
    *st.scale = scale;
    *st.scale_inv = reciprocal(scale);
  }
}

}  // namespace fp8kit
