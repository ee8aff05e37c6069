// fp8kit::cuda::columnwise_from_rowwise: the columnwise copy of an FP8
// tensor as the byte transpose of its rowwise data, through 64x64-byte
// shared-memory tiles. A tile whose rows and columns are all in range and
// 4-byte aligned moves 4 bytes per access (a warp reads two 64-byte rows
// and writes two); edge tiles move single bytes. A plain strided copy
// (torch's .t().contiguous()) reads a byte per access across rows.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch_config.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kTile = 64;                    // bytes per tile side
constexpr int kThreads = 256;
constexpr int kWordsPerRow = kTile / 4;      // 16
constexpr int kPitch = kTile + 4;            // smem row pitch: word aligned, off the banks' period

// in: row-major [rows, cols] bytes; out: row-major [cols, rows]. Tiles are
// numbered along cols first. `words`: rows and cols multiples of 4 and both
// pointers 4-byte aligned (then a full tile moves words).
__global__ void __launch_bounds__(kThreads)
    transpose_bytes_kernel(const uint8_t* __restrict__ in, uint8_t* __restrict__ out,
                           int64_t rows, int64_t cols, int64_t tiles_c, bool words) {
  __shared__ __align__(4) uint8_t tile[kTile][kPitch];
  const int64_t r0 = (int64_t(blockIdx.x) / tiles_c) * kTile;
  const int64_t c0 = (int64_t(blockIdx.x) % tiles_c) * kTile;
  const int t = threadIdx.x;
  if (words && r0 + kTile <= rows && c0 + kTile <= cols) {
    for (int i = t; i < kTile * kWordsPerRow; i += kThreads) {
      const int r = i / kWordsPerRow, w = i % kWordsPerRow;
      *reinterpret_cast<uint32_t*>(&tile[r][4 * w]) =
          reinterpret_cast<const uint32_t*>(in + (r0 + r) * cols + c0)[w];
    }
    __syncthreads();
    // Output row c (tile column c) word w holds tile rows 4w..4w+3.
    for (int i = t; i < kTile * kWordsPerRow; i += kThreads) {
      const int c = i / kWordsPerRow, w = i % kWordsPerRow;
      const uint32_t word = uint32_t(tile[4 * w][c]) | uint32_t(tile[4 * w + 1][c]) << 8 |
                            uint32_t(tile[4 * w + 2][c]) << 16 |
                            uint32_t(tile[4 * w + 3][c]) << 24;
      reinterpret_cast<uint32_t*>(out + (c0 + c) * rows + r0)[w] = word;
    }
    return;
  }
  for (int i = t; i < kTile * kTile; i += kThreads) {
    const int r = i / kTile, c = i % kTile;
    if (r0 + r < rows && c0 + c < cols) tile[r][c] = in[(r0 + r) * cols + c0 + c];
  }
  __syncthreads();
  for (int i = t; i < kTile * kTile; i += kThreads) {
    const int c = i / kTile, r = i % kTile;
    if (c0 + c < cols && r0 + r < rows) out[(c0 + c) * rows + r0 + r] = tile[r][c];
  }
}

}  // namespace

void columnwise_from_rowwise(fp8kit_tensor& tensor, void* stream_ptr) {
  const char* op = "columnwise_from_rowwise";
  int64_t rows = 0, cols = 0;
  flatten_2d(tensor, &rows, &cols);
  if (rows * cols == 0) return;
  ScopedDevice device(tensor.device_index, op);
  const bool words = rows % 4 == 0 && cols % 4 == 0 && is_aligned(tensor.data, 4) &&
                     is_aligned(tensor.columnwise_data, 4);
  const int64_t tiles_c = ceil_div(cols, kTile);
  const int64_t blocks = ceil_div(rows, kTile) * tiles_c;
  transpose_bytes_kernel<<<unsigned(blocks), kThreads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(
      static_cast<const uint8_t*>(tensor.data), static_cast<uint8_t*>(tensor.columnwise_data),
      rows, cols, tiles_c, words);
  check_launch(op, "launching the columnwise-from-rowwise kernel");
}

}  // namespace cuda
}  // namespace fp8kit
