// Host side of the cast kernels: one tensor's cast described once (CastJob)
// and the kernel parameters, kernel kind and block count derived from it.
// Shared by the one-tensor launches (quantize.cu) and the grouped, fused
// ones (quantize_fused.cu), so both pick the same kernel path for a tensor.
#ifndef FP8KIT_CUDA_CAST_JOBS_CUH_
#define FP8KIT_CUDA_CAST_JOBS_CUH_

#include <cstdint>

#include "cast_rowwise.cuh"
#include "cast_transpose.cuh"
#include "launch_config.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {

struct CastJob {
  const void* in;
  int64_t rows, cols;
  uint8_t* out;         // rowwise or NULL
  uint8_t* columnwise;  // or NULL
  float* amax;          // atomicMax target or NULL
  ScaleSource scale;
  bool pdl;             // the previous launch on the stream is ours (zero / amax)
};

// Input data and shape, output data pointers; amax, scale and pdl are the
// caller's to set.
inline CastJob make_job(const fp8kit_tensor& input, const fp8kit_tensor& output) {
  CastJob job{};
  flatten_2d(input, &job.rows, &job.cols);
  job.in = input.data;
  job.out = static_cast<uint8_t*>(output.data);
  job.columnwise = static_cast<uint8_t*>(output.columnwise_data);
  return job;
}

// Which kernel casts a job: the flat one when there is no columnwise copy
// or it has the row-major layout (one row or one column); else
// cast+transpose, with or without the rowwise copy.
enum class CastKind { kFlat, kTransposeWithRowwise, kTransposeOnly };

inline CastKind cast_kind(const CastJob& job) {
  if (job.columnwise == nullptr || job.rows == 1 || job.cols == 1) return CastKind::kFlat;
  return job.out != nullptr ? CastKind::kTransposeWithRowwise : CastKind::kTransposeOnly;
}

inline CastFlatParams flat_params(const CastJob& job) {
  CastFlatParams p;
  p.in = job.in;
  p.out = job.out != nullptr ? job.out : job.columnwise;
  p.out2 = job.out != nullptr ? job.columnwise : nullptr;
  p.amax = job.amax;
  p.scale = job.scale;
  p.n = job.rows * job.cols;
  p.vec = is_aligned(p.in, 16) && is_aligned(p.out, 8) &&
          (p.out2 == nullptr || is_aligned(p.out2, 8));
  return p;
}

inline int64_t flat_blocks(const CastFlatParams& p) { return ceil_div(p.n, kFlatBlockElems); }

inline CastTransposeParams transpose_params(const CastJob& job) {
  CastTransposeParams p;
  p.in = job.in;
  p.out = job.out;
  p.columnwise = job.columnwise;
  p.amax = job.amax;
  p.scale = job.scale;
  p.rows = job.rows;
  p.cols = job.cols;
  p.tiles_c = ceil_div(job.cols, kCtTile);
  p.in_vec = job.cols % 8 == 0 && is_aligned(job.in, 16);
  p.out_vec = job.out != nullptr && job.cols % 8 == 0 && is_aligned(job.out, 8);
  p.columnwise_align = (job.rows % 16 == 0 && is_aligned(job.columnwise, 16)) ? 16
                       : (job.rows % 8 == 0 && is_aligned(job.columnwise, 8))  ? 8
                                                                               : 1;
  return p;
}

inline int64_t transpose_blocks(const CastTransposeParams& p) {
  return ceil_div(p.rows, kCtTile) * p.tiles_c;
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_CAST_JOBS_CUH_
