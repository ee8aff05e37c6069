// The fused cast on the CPU (fp8kit/fused_cast.h): the float32 tensor an
// op computed, handed to the CPU references of
// fp8kit_quantize_delayed_update and fp8kit_quantize_current_scaling, so
// that the fused ops agree with those two functions by construction.
#ifndef FP8KIT_SRC_FUSED_CAST_CPU_H_
#define FP8KIT_SRC_FUSED_CAST_CPU_H_

#include <cstdint>

#include "fp8kit/column_sums.h"
#include "fp8kit/fused_cast.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// Casts v ([rows, cols] float32, row-major) into `out` per `cast`
// (arguments validated by check_fused_cast); `sums`: NULL or column sums
// of v to write.
void fused_cast_cpu(const float* v, int64_t rows, int64_t cols, fp8kit_tensor& out,
                    const fp8kit_fused_cast& cast, const fp8kit_column_sums* sums);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_FUSED_CAST_CPU_H_
