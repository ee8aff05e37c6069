// fp8kit_cast_statistics_of: validation shared by both paths, then the CPU
// reference or the CUDA kernel.
#include "fp8kit/statistics.h"

#include <cstdint>

#include "block_scale_layout.h"
#include "cast_statistics.h"
#include "error.h"
#include "quantize_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

constexpr const char* kOp = "cast_statistics_of";

void check_outputs(const fp8kit_cast_statistics* out, fp8kit_device_type device) {
  FP8KIT_CHECK(out != nullptr, kOp,
               ": out is NULL; pass an fp8kit_cast_statistics with its five pointers set");
  const struct {
    const char* name;
    const void* p;
  } fields[] = {{"amax", out->amax},
                {"underflow", out->underflow},
                {"saturated", out->saturated},
                {"error_sq", out->error_sq},
                {"norm_sq", out->norm_sq}};
  for (const auto& f : fields) {
    FP8KIT_CHECK(f.p != nullptr, kOp, ": out->", f.name,
                 " is NULL; every output is written, so pass one value's buffer on the input's "
                 "device for each");
  }
  if (device == FP8KIT_DEVICE_CPU) return;
  FP8KIT_CHECK(out->workspace != nullptr, kOp,
               ": out->workspace is NULL; a CUDA call needs FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES "
               "bytes of scratch on the input's device");
  FP8KIT_CHECK(reinterpret_cast<uintptr_t>(out->workspace) % alignof(double) == 0, kOp,
               ": out->workspace is not 8-byte aligned; pass an allocation's start");
}

void check_quantized(const fp8kit_tensor& q, bool from_columnwise) {
  check_fp8(kOp, "quantized", q);
  const bool block = is_block_scaling(q.scaling_mode);
  FP8KIT_CHECK(block || q.scaling_mode == FP8KIT_SCALING_PER_TENSOR, kOp, ": quantized has ",
               scaling_mode_name(q.scaling_mode), " (", int(q.scaling_mode),
               "); an FP8 copy is read with its scales: use FP8KIT_SCALING_PER_TENSOR (with "
               "scale_inv), FP8KIT_SCALING_BLOCK_1X128 or FP8KIT_SCALING_BLOCK_128X128");
  const bool empty = fp8kit_tensor_numel(&q) == 0;
  if (block) {
    const char* field = from_columnwise ? "columnwise_block_scale_inv" : "block_scale_inv";
    const float* scales = from_columnwise ? q.columnwise_block_scale_inv : q.block_scale_inv;
    FP8KIT_CHECK(empty || scales != nullptr, kOp, ": quantized->", field,
                 " is NULL; a block-scaled copy is read with the scales of that copy, so pass "
                 "the ones the quantize call wrote");
  } else {
    FP8KIT_CHECK(q.scale_inv != nullptr, kOp,
                 ": quantized->scale_inv is NULL; the FP8 values are dequantized with it, so "
                 "pass the tensor's scale_inv");
  }
  if (empty) return;
  if (from_columnwise) {
    FP8KIT_CHECK(q.columnwise_data != nullptr, kOp,
                 ": from_columnwise is set but quantized->columnwise_data is NULL; pass the "
                 "columnwise copy or read the rowwise data (from_columnwise = 0)");
  } else {
    FP8KIT_CHECK(q.data != nullptr, kOp,
                 ": quantized->data (rowwise) is NULL; pass from_columnwise = 1 to read the "
                 "columnwise copy instead");
  }
}

void check_args(const fp8kit_tensor* input, const fp8kit_tensor* quantized, bool from_columnwise,
                const fp8kit_cast_statistics* out) {
  check_tensor(kOp, "input", input);
  check_high_precision(kOp, "input", *input);
  check_element_aligned(kOp, "input", *input);
  check_tensor(kOp, "quantized", quantized, /*allow_null_data=*/true);
  check_same_device(kOp, "input", *input, "quantized", *quantized);
  check_same_shape(kOp, "input", *input, "quantized", *quantized);
  const int64_t n = fp8kit_tensor_numel(input);
  FP8KIT_CHECK(n < (int64_t(1) << 32), kOp, ": input has ", n, " elements (shape ",
               shape_string(*input), ") but the counts are 32-bit, so at most 2^32 - 1 "
               "elements are taken; compute the statistics of slices and add them up");
  check_quantized(*quantized, from_columnwise);
  check_outputs(out, input->device_type);
}

// row_scale_inv of fp8kit_cast_statistics_of_rows: float32, one per row of
// input's [rows, cols] view, on its device; a per-tensor copy.
void check_row_scales(const fp8kit_tensor& input, const fp8kit_tensor* row_scale_inv) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  check_tensor(kOp, "row_scale_inv", row_scale_inv, /*allow_null_data=*/rows * cols == 0);
  FP8KIT_CHECK(row_scale_inv->dtype == FP8KIT_FLOAT32, kOp,
               ": row_scale_inv must be FP8KIT_FLOAT32 (one scale_inv per row of input)");
  check_same_device(kOp, "input", input, "row_scale_inv", *row_scale_inv);
  FP8KIT_CHECK(fp8kit_tensor_numel(row_scale_inv) == rows, kOp, ": row_scale_inv has ",
               fp8kit_tensor_numel(row_scale_inv), " elements but input (shape ",
               shape_string(input), ") has ", rows,
               " rows; pass one scale_inv per row (for a grouped copy, each row's group's)");
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_cast_statistics_of_rows(const fp8kit_tensor* input,
                                                        const fp8kit_tensor* quantized,
                                                        const fp8kit_tensor* row_scale_inv,
                                                        const fp8kit_cast_statistics* out,
                                                        void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_tensor(fp8kit::kOp, "row_scale_inv", row_scale_inv, /*allow_null_data=*/true);
    FP8KIT_CHECK(quantized == nullptr || quantized->scaling_mode == FP8KIT_SCALING_PER_TENSOR,
                 fp8kit::kOp, ": quantized has ",
                 fp8kit::scaling_mode_name(quantized->scaling_mode),
                 "; a copy read with a scale per row is a per-tensor (or grouped per-tensor) "
                 "copy: use FP8KIT_SCALING_PER_TENSOR");
    // The per-tensor checks ask for quantized->scale_inv, which is not read
    // here: a stand-in keeps them from refusing a NULL one.
    static float unread_scale_inv = 1.0f;
    fp8kit_tensor copy = quantized != nullptr ? *quantized : fp8kit_tensor{};
    if (copy.scale_inv == nullptr) copy.scale_inv = &unread_scale_inv;
    fp8kit::check_args(input, quantized != nullptr ? &copy : nullptr, false, out);
    fp8kit::check_row_scales(*input, row_scale_inv);
    const float* rows = static_cast<const float*>(row_scale_inv->data);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::cast_statistics_cpu(*input, copy, false, rows, *out);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::cast_statistics(*input, copy, false, rows, *out, stream);
#endif
    }
    (void)stream;
  });
}

extern "C" fp8kit_status fp8kit_cast_statistics_of(const fp8kit_tensor* input,
                                                   const fp8kit_tensor* quantized,
                                                   int from_columnwise,
                                                   const fp8kit_cast_statistics* out,
                                                   void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_args(input, quantized, from_columnwise != 0, out);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::cast_statistics_cpu(*input, *quantized, from_columnwise != 0, nullptr, *out);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::cast_statistics(*input, *quantized, from_columnwise != 0, nullptr, *out,
                                    stream);
#endif
    }
    (void)stream;
  });
}
