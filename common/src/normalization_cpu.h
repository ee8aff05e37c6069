// CPU reference of fp8kit/normalization.h (arguments validated).
#ifndef FP8KIT_SRC_NORMALIZATION_CPU_H_
#define FP8KIT_SRC_NORMALIZATION_CPU_H_

#include "fp8kit/normalization.h"

namespace fp8kit {

// beta, y, mean: NULL when absent; y_fp8 and cast NULL: no cast.
void norm_forward_cpu(const fp8kit_norm_config& config, const fp8kit_tensor& x,
                      const fp8kit_tensor& gamma, const fp8kit_tensor* beta, fp8kit_tensor* y,
                      fp8kit_tensor* y_fp8, const fp8kit_fused_cast* cast, fp8kit_tensor* mean,
                      fp8kit_tensor& rsigma);

// mean, dbeta: NULL when absent (RMSNorm).
void norm_backward_cpu(const fp8kit_norm_config& config, const fp8kit_tensor& dy,
                       const fp8kit_tensor& x, const fp8kit_tensor* mean,
                       const fp8kit_tensor& rsigma, const fp8kit_tensor& gamma, fp8kit_tensor& dx,
                       fp8kit_tensor& dgamma, fp8kit_tensor* dbeta);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_NORMALIZATION_CPU_H_
