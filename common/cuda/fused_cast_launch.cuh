// Host side of the fused cast (fp8kit/fused_cast.h): the passes a fused op
// launches and what each pass's kernel is told (FusedCast).
//   delayed, slot with a `seeded` flag: amax pass (whose blocks exit at
//            once when the slot is seeded), then the cast pass;
//   delayed, no flag (seeded):          the cast pass only;
//   current: zero amax, amax pass, cast pass, each a programmatic
//            dependent launch of the one before (pdl.cuh);
//   no cast (the op's FP8 output NULL): one values pass.
// The cast pass of delayed scaling accumulates the amax only when
// recording, and its last block runs the update (fused_update_device.cuh);
// the scale follows read_scale's rules, so the result is
// fp8kit_quantize_delayed_update's / fp8kit_quantize_current_scaling's.
#ifndef FP8KIT_CUDA_FUSED_CAST_LAUNCH_CUH_
#define FP8KIT_CUDA_FUSED_CAST_LAUNCH_CUH_

#include <cuda_runtime.h>

#include "fp8kit/fused_cast.h"
#include "fused_cast_device.cuh"
#include "pdl.cuh"
#include "quantize_launch.h"

namespace fp8kit {
namespace cuda {

struct FusedCastPasses {
  bool values_only; // no cast: launch the op's kernel once, in its values mode
  bool amax_pass;   // launch the op's kernel in its amax mode first
  bool pdl;         // launch both passes with launch_pdl
  FusedCast amax;   // for the amax pass
  FusedCast cast;   // for the cast pass
};

// Launches the zeroing (current scaling) and returns the passes. `out`
// and `cast` NULL: the op casts nothing.
inline FusedCastPasses prepare_fused_cast(const fp8kit_tensor* out_ptr,
                                          const fp8kit_fused_cast* cast_ptr, cudaStream_t stream,
                                          const char* op) {
  FusedCastPasses p{};
  if (out_ptr == nullptr) {
    p.values_only = true;
    return p;
  }
  const fp8kit_tensor& out = *out_ptr;
  const fp8kit_fused_cast& cast = *cast_ptr;
  const float fp8_max = fp8kit_fp8_max(out.dtype);
  p.cast.out = static_cast<uint8_t*>(out.data);
  p.cast.columnwise = static_cast<uint8_t*>(out.columnwise_data);
  if (cast.recipe == FP8KIT_FUSED_CAST_CURRENT) {
    launch_zero_amax(out.amax, stream, op);
    p.amax_pass = true;
    p.pdl = true;
    p.amax.amax = out.amax;
    p.cast.scale = current_scale_source(out.amax, fp8_max, cast.current_config, out.scale,
                                        out.scale_inv);
    return p;
  }
  const fp8kit_delayed_quantize_state& s = cast.state;
  p.amax_pass = s.seeded != nullptr;
  p.amax.amax = s.amax;
  p.amax.skip_if = s.seeded;
  p.cast.scale = delayed_scale_source(s.scale, fp8_max, out.scale_inv);
  p.cast.scale.seeded = s.seeded;
  p.cast.scale.seed_amax = s.amax;
  p.cast.scale.margin = cast.delayed_config.margin;
  p.cast.amax = cast.record ? s.amax : nullptr;
  p.cast.update = true;
  p.cast.state = FusedState{s.amax_history, s.amax, s.scale, s.scale_inv, s.counter, s.seeded,
                            fp8_max};
  p.cast.config = UpdateConfig{cast.delayed_config.amax_history_len, cast.delayed_config.margin,
                               cast.delayed_config.amax_reduction == FP8KIT_AMAX_MOST_RECENT,
                               cast.record != 0};
  return p;
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_FUSED_CAST_LAUNCH_CUH_
