// CPU reference of the delayed-scaling update (fp8kit/delayed_scaling.h).
#ifndef FP8KIT_SRC_DELAYED_SCALING_CPU_H_
#define FP8KIT_SRC_DELAYED_SCALING_CPU_H_

#include "fp8kit/delayed_scaling.h"

namespace fp8kit {

// Updates each state in order (arguments validated).
void delayed_scaling_update_cpu(const fp8kit_delayed_scaling_state* states, int count,
                                const fp8kit_delayed_scaling_config& config);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_DELAYED_SCALING_CPU_H_
