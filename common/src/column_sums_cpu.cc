#include "column_sums_cpu.h"

#include <cstdint>
#include <vector>

#include "column_sums.h"
#include "element_load.h"
#include "error.h"
#include "validate.h"

namespace fp8kit {
namespace {

template <typename Load>
void column_sums_typed(const void* in, int64_t rows, int64_t cols, const fp8kit_column_sums& s) {
  std::vector<float> total(size_t(cols), 0.0f);
  for (int64_t t0 = 0; t0 < rows; t0 += kSumTileRows) {
    for (int64_t c = 0; c < cols; ++c) {
      float tile = 0.0f;
      for (int64_t g0 = t0; g0 < t0 + kSumTileRows; g0 += kSumGroupRows) {
        float group = 0.0f;
        for (int64_t r = g0; r < g0 + kSumGroupRows; ++r) {
          group = add_rn(group, r < rows ? Load::load(in, r * cols + c) : 0.0f);
        }
        tile = add_rn(tile, group);
      }
      total[size_t(c)] = add_rn(total[size_t(c)], tile);
    }
  }
  for (int64_t c = 0; c < cols; ++c) store_rounded(s.sums, s.dtype, c, total[size_t(c)]);
}

}  // namespace

void check_column_sums(const char* op, const std::string& sums_arg, const std::string& input_arg,
                       const std::string& columnwise_arg, const fp8kit_tensor& input,
                       const fp8kit_tensor& output, const fp8kit_column_sums& s) {
  FP8KIT_CHECK(s.dtype == FP8KIT_FLOAT32 || s.dtype == FP8KIT_BFLOAT16 ||
                   s.dtype == FP8KIT_FLOAT16,
               op, ": ", sums_arg, ".dtype is ", fp8kit_dtype_name(s.dtype),
               "; column sums are float32, bfloat16 or float16");
  FP8KIT_CHECK(s.partials != nullptr && s.counters != nullptr, op, ": ", sums_arg,
               " has a NULL partials or counters; both are required (partials: "
               "fp8kit_column_sums_workspace(rows, cols) floats, counters: ceil(cols / 128) "
               "zeros)");
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  FP8KIT_CHECK(output.columnwise_data != nullptr && rows > 1 && cols > 1, op, ": ", sums_arg,
               " asks for column sums of ", input_arg, " (", shape_string(input),
               "), which the cast+transpose pass computes: it needs ", columnwise_arg,
               " and a 2-D view with rows > 1 and cols > 1; sum other tensors separately");
}

void column_sums_cpu(const fp8kit_tensor& input, const fp8kit_column_sums& s) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  switch (input.dtype) {
    case FP8KIT_FLOAT32: column_sums_typed<LoadF32>(input.data, rows, cols, s); break;
    case FP8KIT_BFLOAT16: column_sums_typed<LoadBF16>(input.data, rows, cols, s); break;
    default: column_sums_typed<LoadF16>(input.data, rows, cols, s); break;
  }
}

}  // namespace fp8kit

extern "C" int64_t fp8kit_column_sums_workspace(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return (rows + fp8kit::kSumTileRows - 1) / fp8kit::kSumTileRows * cols;
}
