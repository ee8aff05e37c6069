#include "gemm_block_rules.h"

#include <string>

#include "block_scale_layout.h"
#include "error.h"
#include "fp8kit/device.h"
#include "fp8kit/status.h"
#include "quantize_validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

// The cached capability query (fp8kit/device.h); on a device without the
// block-scaled kernels, an error saying what the device and library are.
void check_device_supports_block_scaled(fp8kit_device_type type, int index) {
  int supported = 0;
  const fp8kit_status st = fp8kit_supports_block_scaled_fp8_gemm(type, index, &supported);
  if (st != FP8KIT_OK) fail(st, fp8kit_last_error());
  if (supported) return;
  std::string why;
#ifdef FP8KIT_WITH_CUDA
  why = cuda::block_scaled_fp8_gemm_missing(index);
#endif
  fail(FP8KIT_UNSUPPORTED, "gemm: A and B are block-scaled, but ", why,
       "; cuBLASLt runs block-scaled FP8 GEMMs on Hopper (compute capability 9.0) with "
       "cuBLASLt 12.9 or newer only. Use per-tensor scaling (DelayedScaling or "
       "CurrentScaling) on this device");
}

}  // namespace

bool gemm_is_block_scaled(const fp8kit_tensor& a, const fp8kit_tensor& b) {
  const bool a_block = is_block_scaling(a.scaling_mode);
  const bool b_block = is_block_scaling(b.scaling_mode);
  FP8KIT_CHECK(a_block == b_block, "gemm: A has ", scaling_mode_name(a.scaling_mode),
               " but B has ", scaling_mode_name(b.scaling_mode),
               "; cuBLASLt multiplies block-scaled operands only with block-scaled operands: "
               "quantize ", a_block ? "B" : "A", " with fp8kit_quantize_block_scaling too");
  return a_block;
}

void check_block_scaled_gemm(const fp8kit_tensor& a, const fp8kit_tensor& b,
                             const fp8kit_tensor& d, const fp8kit_gemm_config& config, int64_t m,
                             int64_t n) {
  FP8KIT_CHECK(!(a.scaling_mode == FP8KIT_SCALING_BLOCK_128X128 &&
                 b.scaling_mode == FP8KIT_SCALING_BLOCK_128X128),
               "gemm: A and B are both FP8KIT_SCALING_BLOCK_128X128; cuBLASLt multiplies "
               "1x128 x 1x128, 1x128 x 128x128 and 128x128 x 1x128 only. Quantize the "
               "activation or gradient operand with FP8KIT_SCALING_BLOCK_1X128");
  check_device_supports_block_scaled(d.device_type, d.device_index);
  FP8KIT_CHECK(d.dtype == FP8KIT_BFLOAT16 || d.dtype == FP8KIT_FLOAT32, "gemm: D is ",
               fp8kit_dtype_name(d.dtype),
               " but a block-scaled FP8 GEMM writes a bfloat16 or float32 D");
  FP8KIT_CHECK(config.epilogue == FP8KIT_EPILOGUE_DEFAULT ||
                   config.epilogue == FP8KIT_EPILOGUE_BIAS,
               "gemm: config.epilogue is ", int(config.epilogue),
               " but a block-scaled FP8 GEMM takes FP8KIT_EPILOGUE_DEFAULT or "
               "FP8KIT_EPILOGUE_BIAS only; apply the GELU separately");
  FP8KIT_CHECK(config.use_split_accumulator != 0,
               "gemm: config.use_split_accumulator is 0 but cuBLASLt's block-scaled FP8 GEMM "
               "has no fast-accumulation mode; set it to 1");
  constexpr int64_t mult = FP8KIT_BLOCK_GEMM_MN_MULTIPLE;
  FP8KIT_CHECK(n % mult == 0, "gemm: N is ", n,
               " but a block-scaled FP8 GEMM needs N (the rows of op(B)^T, the output "
               "columns) to be a multiple of ", mult, "; pad it");
  FP8KIT_CHECK(a.scaling_mode != FP8KIT_SCALING_BLOCK_1X128 || m % mult == 0, "gemm: M is ", m,
               " but a block-scaled FP8 GEMM with a 1x128-scaled A needs M (the rows of "
               "op(A), the output rows) to be a multiple of ", mult, "; pad it");
}

const float* block_scales_of(const char* name, const fp8kit_tensor& t, bool from_columnwise) {
  const char* field = from_columnwise ? "columnwise_block_scale_inv" : "block_scale_inv";
  const float* scales = from_columnwise ? t.columnwise_block_scale_inv : t.block_scale_inv;
  FP8KIT_CHECK(scales != nullptr, "gemm: ", name, " is read from its ",
               from_columnwise ? "columnwise data" : "rowwise data", " but ", name, "->", field,
               " is NULL; quantize ", name, " with fp8kit_quantize_block_scaling into that copy");
  check_block_scales_aligned("gemm", name, field, scales);
  return scales;
}

}  // namespace fp8kit
