// fp8kit_columnwise_from_rowwise: validation, then the CPU reference (here:
// a byte transpose) or the CUDA kernel.
#include <cstdint>
#include <cstring>

#include "block_scale_layout.h"
#include "error.h"
#include "fp8kit/quantize.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

void columnwise_from_rowwise_cpu(fp8kit_tensor& t) {
  int64_t rows = 0, cols = 0;
  flatten_2d(t, &rows, &cols);
  const auto* in = static_cast<const uint8_t*>(t.data);
  auto* out = static_cast<uint8_t*>(t.columnwise_data);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_columnwise_from_rowwise(fp8kit_tensor* tensor, void* stream) {
  return fp8kit::guard([&] {
    using namespace fp8kit;
    constexpr const char* op = "columnwise_from_rowwise";
    check_tensor(op, "tensor", tensor);
    check_fp8(op, "tensor", *tensor);
    FP8KIT_CHECK(!is_block_scaling(tensor->scaling_mode), op,
                 ": tensor is block-scaled, and a block-scaled columnwise copy has scales of "
                 "its own; quantize the high-precision tensor with columnwise output instead");
    if (fp8kit_tensor_numel(tensor) == 0) return;
    check_not_null(op, "tensor->columnwise_data", tensor->columnwise_data);
    FP8KIT_CHECK(tensor->columnwise_data != tensor->data, op,
                 ": tensor->columnwise_data is tensor->data; the transpose needs its own buffer");
    if (tensor->device_type == FP8KIT_DEVICE_CPU) {
      columnwise_from_rowwise_cpu(*tensor);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::columnwise_from_rowwise(*tensor, stream);
#endif
    }
    (void)stream;
  });
}
