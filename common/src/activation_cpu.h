// CPU reference of fp8kit/activation.h (arguments validated).
#ifndef FP8KIT_SRC_ACTIVATION_CPU_H_
#define FP8KIT_SRC_ACTIVATION_CPU_H_

#include "fp8kit/activation.h"

namespace fp8kit {

// a: NULL when absent; a_fp8 and cast NULL: no cast.
void activation_forward_cpu(fp8kit_activation act, const fp8kit_tensor& h, fp8kit_tensor* a,
                            fp8kit_tensor* a_fp8, const fp8kit_fused_cast* cast);

// dh, sums: NULL when absent; dh_fp8 and cast NULL: no cast.
void activation_backward_cpu(fp8kit_activation act, const fp8kit_tensor& d_a,
                             const fp8kit_tensor& h, fp8kit_tensor* dh, fp8kit_tensor* dh_fp8,
                             const fp8kit_fused_cast* cast, const fp8kit_column_sums* sums);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_ACTIVATION_CPU_H_
