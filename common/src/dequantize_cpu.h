// CPU reference of dequantization, per-tensor and block-scaled.
#ifndef FP8KIT_SRC_DEQUANTIZE_CPU_H_
#define FP8KIT_SRC_DEQUANTIZE_CPU_H_

#include "fp8kit/tensor.h"

namespace fp8kit {

// output = q * scale_inv (the tensor's, or each element's block's), from the
// rowwise data or (from_columnwise) from the columnwise copy transposed back
// to the logical shape. Arguments validated.
void dequantize_cpu(const fp8kit_tensor& input, fp8kit_tensor& output, bool from_columnwise);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_DEQUANTIZE_CPU_H_
