// CPU reference of block-scaled quantization (fp8kit/block_scaling.h).
#ifndef FP8KIT_SRC_QUANTIZE_BLOCK_CPU_H_
#define FP8KIT_SRC_QUANTIZE_BLOCK_CPU_H_

#include "fp8kit/quantize.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// fp8kit_quantize_block_scaling on a CPU tensor (arguments validated): the
// copies `output` holds, with their scales, padding included.
void quantize_block_scaling_cpu(const fp8kit_tensor& input, fp8kit_tensor& output,
                                const fp8kit_current_scaling_config& config);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_QUANTIZE_BLOCK_CPU_H_
