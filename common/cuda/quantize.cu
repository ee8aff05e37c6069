// fp8kit::cuda::quantize (delayed scaling: scale given) and
// quantize_current_scaling (amax pass, then the cast pass deriving the
// scale on the device): kernel choice and launches.
//
// Launch sequence, all on the caller's stream, no allocation:
//   delayed:  [zero amax] -> cast kernel (atomicMax into amax)
//   current:  zero amax -> amax kernel -> cast kernel (reads amax, block 0
//             writes scale and scale_inv; with column sums, the
//             cast+transpose kernel also sums, as column_sums.cuh says)
// Each kernel after the zeroing one is a programmatic dependent launch of
// its predecessor (pdl.cuh): it starts at once and waits only where it
// needs the predecessor's result (the amax atomic, the scale). A cast
// kernel not preceded by one of ours is launched normally.
#include <cuda_runtime.h>

#include <cstdint>

#include "cast_jobs.cuh"
#include "cuda_backend.h"
#include "column_sums.cuh"
#include "cuda_check.h"
#include "launch_config.h"
#include "pdl.cuh"
#include "quantize_launch.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

// The cast+transpose kernel that also writes column sums.
struct CastTransposeSumsParams {
  CastTransposeParams cast;
  SumsJob sums;
};

template <int kIn, bool kE4M3, bool kRowwise>
__global__ void __launch_bounds__(kCtThreads, kIn == FP8KIT_FLOAT32 ? 2 : 4)
    cast_transpose_sums_kernel(const CastTransposeSumsParams p) {
  __shared__ GroupSums group_sums;
  cast_transpose_block<kIn, kE4M3, kRowwise, true>(p.cast, blockIdx.x, &group_sums);
  finish_column_sums(p.sums, p.cast, blockIdx.x, group_sums);
}

// `sums`: NULL, or (validated) a cast+transpose job's column sums.
template <int kIn, bool kE4M3>
void launch_cast_typed(const CastJob& job, const fp8kit_column_sums* sums, cudaStream_t stream,
                       const char* op) {
  if (sums != nullptr) {
    const CastTransposeSumsParams p{transpose_params(job), sums_job(*sums, job.rows)};
    if (cast_kind(job) == CastKind::kTransposeWithRowwise) {
      launch_pdl_or_plain(cast_transpose_sums_kernel<kIn, kE4M3, true>, transpose_blocks(p.cast),
                          kCtThreads, p, job.pdl, stream, op,
                          "launching the cast+transpose kernel with column sums");
    } else {
      launch_pdl_or_plain(cast_transpose_sums_kernel<kIn, kE4M3, false>, transpose_blocks(p.cast),
                          kCtThreads, p, job.pdl, stream, op,
                          "launching the cast+transpose kernel with column sums");
    }
    return;
  }
  switch (cast_kind(job)) {
    case CastKind::kFlat: {
      const CastFlatParams p = flat_params(job);
      launch_pdl_or_plain(cast_flat_kernel<kIn, kE4M3>, flat_blocks(p), kFlatThreads, p, job.pdl,
                          stream, op, "launching the cast kernel");
      return;
    }
    case CastKind::kTransposeWithRowwise: {
      const CastTransposeParams p = transpose_params(job);
      launch_pdl_or_plain(cast_transpose_kernel<kIn, kE4M3, true>, transpose_blocks(p), kCtThreads,
                          p, job.pdl, stream, op, "launching the cast+transpose kernel");
      return;
    }
    case CastKind::kTransposeOnly: {
      const CastTransposeParams p = transpose_params(job);
      launch_pdl_or_plain(cast_transpose_kernel<kIn, kE4M3, false>, transpose_blocks(p), kCtThreads,
                          p, job.pdl, stream, op, "launching the cast+transpose kernel");
      return;
    }
  }
}

template <int kIn>
void launch_cast_in(const CastJob& job, fp8kit_dtype fp8_dtype, const fp8kit_column_sums* sums,
                    cudaStream_t stream, const char* op) {
  if (fp8_dtype == FP8KIT_E4M3) {
    launch_cast_typed<kIn, true>(job, sums, stream, op);
  } else {
    launch_cast_typed<kIn, false>(job, sums, stream, op);
  }
}

void launch_cast(const CastJob& job, fp8kit_dtype in_dtype, fp8kit_dtype fp8_dtype,
                 const fp8kit_column_sums* sums, cudaStream_t stream, const char* op) {
  switch (in_dtype) {
    case FP8KIT_FLOAT32: launch_cast_in<FP8KIT_FLOAT32>(job, fp8_dtype, sums, stream, op); break;
    case FP8KIT_BFLOAT16: launch_cast_in<FP8KIT_BFLOAT16>(job, fp8_dtype, sums, stream, op); break;
    default: launch_cast_in<FP8KIT_FLOAT16>(job, fp8_dtype, sums, stream, op); break;
  }
}

}  // namespace

void quantize(const fp8kit_tensor& input, fp8kit_tensor& output, void* stream_ptr) {
  const char* op = "quantize";
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (output.amax != nullptr) launch_zero_amax(output.amax, stream, op);
  CastJob job = make_job(input, output);
  job.amax = output.amax;
  job.pdl = output.amax != nullptr;
  job.scale = delayed_scale_source(output.scale, fp8kit_fp8_max(output.dtype), output.scale_inv);
  if (job.rows * job.cols == 0) {
    if (output.scale_inv != nullptr) launch_scale_kernel(job.scale, stream, op);
    return;
  }
  launch_cast(job, input.dtype, output.dtype, nullptr, stream, op);
}

void quantize_current_scaling(const fp8kit_tensor& input, fp8kit_tensor& output,
                              const fp8kit_current_scaling_config& config,
                              const fp8kit_column_sums* sums, void* stream_ptr) {
  const char* op = "quantize_current_scaling";
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  launch_zero_amax(output.amax, stream, op);
  CastJob job = make_job(input, output);
  job.amax = nullptr;  // the cast pass reads the finished amax instead
  job.pdl = true;      // right after the amax kernel
  job.scale = current_scale_source(output.amax, fp8kit_fp8_max(output.dtype), config,
                                   output.scale, output.scale_inv);
  const int64_t n = job.rows * job.cols;
  if (n == 0) {
    launch_scale_kernel(job.scale, stream, op);  // amax 0 -> scale 1
    return;
  }
  launch_amax(input.data, input.dtype, n, output.amax, stream, op);
  launch_cast(job, input.dtype, output.dtype, sums, stream, op);
}

}  // namespace cuda
}  // namespace fp8kit
