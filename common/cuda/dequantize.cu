// fp8kit::cuda::dequantize: output = q * scale_inv, rowwise (elementwise) or
// from the columnwise copy (transposed back through a 32x32 shared-memory
// tile), with the tensor's scale_inv or each element's block's. The
// arithmetic is dequantize_convert.h's, shared with the CPU reference, so
// both give the same bits. Not a performance target.
#include <cuda_runtime.h>

#include <cstdint>

#include "block_scale_layout.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "dequant_scales.cuh"
#include "dequantize_convert.h"
#include "launch_config.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kDqThreads = 256;
constexpr int kDqTile = 32;

template <int kOut>
__device__ __forceinline__ void store_value(void* out, int64_t i, float v) {
  if constexpr (kOut == FP8KIT_FLOAT32) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (kOut == FP8KIT_BFLOAT16) {
    static_cast<uint16_t*>(out)[i] = float_to_bf16_bits(v);
  } else {
    static_cast<uint16_t*>(out)[i] = float_to_fp16_bits(v);
  }
}

// `cols`: row length of the stored copy (block scaling only).
template <int kOut>
__global__ void __launch_bounds__(kDqThreads)
    dequantize_rowwise_kernel(const uint8_t* __restrict__ q, void* out, int64_t n, int64_t cols,
                              const DequantScales scales, fp8kit_dtype fp8_dtype) {
  const int64_t stride = int64_t(gridDim.x) * kDqThreads;
  for (int64_t i = int64_t(blockIdx.x) * kDqThreads + threadIdx.x; i < n; i += stride) {
    const float s = scales.block ? scales.at(i / cols, i % cols, 0.0f) : *scales.scale_inv;
    store_value<kOut>(out, i, dequantize_value(q[i], fp8_dtype, s));
  }
}

// columnwise is row-major [cols, rows]; out is row-major [rows, cols]. One
// block per 32x32 tile, tiles numbered along cols first.
template <int kOut>
__global__ void __launch_bounds__(kDqTile * 8)
    dequantize_columnwise_kernel(const uint8_t* __restrict__ columnwise, void* out, int64_t rows,
                                 int64_t cols, int64_t tiles_c, const DequantScales scales,
                                 fp8kit_dtype fp8_dtype) {
  __shared__ uint8_t tile[kDqTile][kDqTile + 1];
  const float per_tensor = scales.block ? 0.0f : *scales.scale_inv;
  const int64_t r0 = (int64_t(blockIdx.x) / tiles_c) * kDqTile;
  const int64_t c0 = (int64_t(blockIdx.x) % tiles_c) * kDqTile;
  const int tx = threadIdx.x % kDqTile;
  const int ty = threadIdx.x / kDqTile;
  for (int i = ty; i < kDqTile; i += 8) {
    const int64_t c = c0 + i, r = r0 + tx;
    if (c < cols && r < rows) tile[i][tx] = columnwise[c * rows + r];  // coalesced along rows
  }
  __syncthreads();
  for (int i = ty; i < kDqTile; i += 8) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r < rows && c < cols) {
      // Stored element (c, r) of the columnwise copy.
      store_value<kOut>(out, r * cols + c,
                        dequantize_value(tile[tx][i], fp8_dtype, scales.at(c, r, per_tensor)));
    }
  }
}

template <int kOut>
void launch_dequantize(const fp8kit_tensor& input, fp8kit_tensor& output, bool from_columnwise,
                       cudaStream_t stream, const char* op) {
  int64_t rows = 0, cols = 0;
  flatten_2d(input, &rows, &cols);
  const int64_t n = rows * cols;
  const DequantScales scales = dequant_scales(input, from_columnwise, rows, cols);
  if (!from_columnwise || (!scales.block && (rows == 1 || cols == 1))) {
    // One row or one column: the columnwise copy has the row-major layout
    // (its per-tensor scale does not care which).
    const uint8_t* q =
        static_cast<const uint8_t*>(from_columnwise ? input.columnwise_data : input.data);
    int64_t blocks = ceil_div(n, kDqThreads);
    const int64_t max_blocks = int64_t(sm_count(op)) * 8;
    if (blocks > max_blocks) blocks = max_blocks;
    dequantize_rowwise_kernel<kOut><<<unsigned(blocks), kDqThreads, 0, stream>>>(
        q, output.data, n, cols, scales, input.dtype);
    check_launch(op, "launching the dequantize kernel");
    return;
  }
  const int64_t tiles_c = ceil_div(cols, kDqTile);
  const int64_t blocks = ceil_div(rows, kDqTile) * tiles_c;
  dequantize_columnwise_kernel<kOut><<<unsigned(blocks), kDqTile * 8, 0, stream>>>(
      static_cast<const uint8_t*>(input.columnwise_data), output.data, rows, cols, tiles_c,
      scales, input.dtype);
  check_launch(op, "launching the columnwise dequantize kernel");
}

}  // namespace

void dequantize(const fp8kit_tensor& input, fp8kit_tensor& output, bool from_columnwise,
                void* stream_ptr) {
  const char* op = "dequantize";
  if (fp8kit_tensor_numel(&input) == 0) return;
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (output.dtype) {
    case FP8KIT_FLOAT32:
      launch_dequantize<FP8KIT_FLOAT32>(input, output, from_columnwise, stream, op);
      break;
    case FP8KIT_BFLOAT16:
      launch_dequantize<FP8KIT_BFLOAT16>(input, output, from_columnwise, stream, op);
      break;
    default:
      launch_dequantize<FP8KIT_FLOAT16>(input, output, from_columnwise, stream, op);
      break;
  }
}

}  // namespace cuda
}  // namespace fp8kit
