// Column sums (fp8kit_column_sums) outside the kernels: the argument
// checks both quantize entry points share, and the CPU reference in the
// documented order (column_sums.h).
#ifndef FP8KIT_SRC_COLUMN_SUMS_CPU_H_
#define FP8KIT_SRC_COLUMN_SUMS_CPU_H_

#include <string>

#include "fp8kit/column_sums.h"
#include "fp8kit/tensor.h"

namespace fp8kit {

// `sums` has a column-sum dtype and its workspace, and `output` is
// written by the cast+transpose pass (a columnwise copy, a 2-D view with
// rows > 1 and cols > 1). Messages name the arguments as the caller spells
// them: sums_arg ("sums[1]"), input_arg ("inputs[1]"), columnwise_arg
// ("outputs[1].columnwise_data").
void check_column_sums(const char* op, const std::string& sums_arg, const std::string& input_arg,
                       const std::string& columnwise_arg, const fp8kit_tensor& input,
                       const fp8kit_tensor& output, const fp8kit_column_sums& sums);

// Writes the column sums of a validated CPU input.
void column_sums_cpu(const fp8kit_tensor& input, const fp8kit_column_sums& sums);

}  // namespace fp8kit

#endif  // FP8KIT_SRC_COLUMN_SUMS_CPU_H_
