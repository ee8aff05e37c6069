// CPU reference GEMM, per-tensor or block-scaled: dequantize, multiply with
// a double accumulator, apply alpha/beta, bias and GELU, then write D
// (quantizing an FP8 D with the shared conversion of fp8_convert.h). Simple
// on purpose: it is the reference the CUDA GEMM is tested against. Each
// output's dot product is summed over K in order, one product at a time,
// so its bits do not depend on the tiles of outputs computed together,
// which make it fast enough to train the demo's model on a CPU.
#ifndef FP8KIT_SRC_GEMM_CPU_H_
#define FP8KIT_SRC_GEMM_CPU_H_

#include "gemm_problem.h"

namespace fp8kit {

void gemm_cpu(const GemmProblem& p);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_GEMM_CPU_H_
