// fp8kit::cuda::quantize (delayed scaling: scale given) and
// quantize_current_scaling (amax pass, then the cast pass deriving the
// scale on the device): kernel choice and launches.
//
// Launch sequence, all on the caller's stream, no allocation:
//   delayed:  [zero amax] -> cast kernel (atomicMax into amax)
//   current:  zero amax -> amax kernel -> cast kernel (reads amax, block 0
//             writes scale and scale_inv)
// Each kernel after the zeroing one is a programmatic dependent launch of
// its predecessor (pdl.cuh): it starts at once and waits only where it
// needs the predecessor's result (the amax atomic, the scale). A cast
// kernel not preceded by one of ours is launched normally.
#include <cuda_runtime.h>

#include <cstdint>

#include "cast_rowwise.cuh"
#include "cast_transpose.cuh"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch_config.h"
#include "pdl.cuh"
#include "quantize_launch.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

struct CastJob {
  const void* in;
  int64_t rows, cols;
  uint8_t* out;     // rowwise or NULL
  uint8_t* out_t;   // columnwise or NULL
  float* amax;      // atomicMax target or NULL
  ScaleSource scale;
  bool pdl;         // the previous launch on the stream is ours (zero / amax)
};

template <typename Params>
void launch(void (*kernel)(Params), int64_t blocks, int threads, const Params& p, bool pdl,
            cudaStream_t stream, const char* op, const char* what) {
  if (pdl) {
    launch_pdl(kernel, dim3(unsigned(blocks)), dim3(threads), stream, op, what, p);
  } else {
    kernel<<<unsigned(blocks), threads, 0, stream>>>(p);
    check_launch(op, what);
  }
}

template <int kIn, bool kE4M3>
void launch_cast_typed(const CastJob& job, cudaStream_t stream, const char* op) {
  const int64_t n = job.rows * job.cols;
  // One row or one column: the columnwise copy has the row-major layout.
  if (job.out_t == nullptr || job.rows == 1 || job.cols == 1) {
    CastFlatParams p;
    p.in = job.in;
    p.out = job.out != nullptr ? job.out : job.out_t;
    p.out2 = job.out != nullptr ? job.out_t : nullptr;
    p.amax = job.amax;
    p.scale = job.scale;
    p.n = n;
    p.vec = is_aligned(p.in, 16) && is_aligned(p.out, 8) &&
            (p.out2 == nullptr || is_aligned(p.out2, 8));
    launch(cast_flat_kernel<kIn, kE4M3>, ceil_div(n, kFlatBlockElems), kFlatThreads, p, job.pdl,
           stream, op, "launching the cast kernel");
    return;
  }
  CastTransposeParams p;
  p.in = job.in;
  p.out = job.out;
  p.out_t = job.out_t;
  p.amax = job.amax;
  p.scale = job.scale;
  p.rows = job.rows;
  p.cols = job.cols;
  p.tiles_c = ceil_div(job.cols, kCtTile);
  p.in_vec = job.cols % 8 == 0 && is_aligned(job.in, 16);
  p.out_vec = job.out != nullptr && job.cols % 8 == 0 && is_aligned(job.out, 8);
  p.t_align = (job.rows % 16 == 0 && is_aligned(job.out_t, 16))  ? 16
              : (job.rows % 8 == 0 && is_aligned(job.out_t, 8)) ? 8
                                                                 : 1;
  const int64_t blocks = ceil_div(job.rows, kCtTile) * p.tiles_c;
  if (job.out != nullptr) {
    launch(cast_transpose_kernel<kIn, kE4M3, true>, blocks, kCtThreads, p, job.pdl, stream, op,
           "launching the cast+transpose kernel");
  } else {
    launch(cast_transpose_kernel<kIn, kE4M3, false>, blocks, kCtThreads, p, job.pdl, stream, op,
           "launching the cast+transpose kernel");
  }
}

template <int kIn>
void launch_cast_in(const CastJob& job, fp8kit_dtype fp8_dtype, cudaStream_t stream,
                    const char* op) {
  if (fp8_dtype == FP8KIT_E4M3) {
    launch_cast_typed<kIn, true>(job, stream, op);
  } else {
    launch_cast_typed<kIn, false>(job, stream, op);
  }
}

void launch_cast(const CastJob& job, fp8kit_dtype in_dtype, fp8kit_dtype fp8_dtype,
                 cudaStream_t stream, const char* op) {
  switch (in_dtype) {
    case FP8KIT_FLOAT32: launch_cast_in<FP8KIT_FLOAT32>(job, fp8_dtype, stream, op); break;
    case FP8KIT_BFLOAT16: launch_cast_in<FP8KIT_BFLOAT16>(job, fp8_dtype, stream, op); break;
    default: launch_cast_in<FP8KIT_FLOAT16>(job, fp8_dtype, stream, op); break;
  }
}

CastJob make_job(const fp8kit_tensor& input, fp8kit_tensor& output) {
  CastJob job{};
  flatten_2d(input, &job.rows, &job.cols);
  job.in = input.data;
  job.out = static_cast<uint8_t*>(output.data);
  job.out_t = static_cast<uint8_t*>(output.columnwise_data);
  return job;
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
  job.scale = ScaleSource{output.scale, nullptr, fp8kit_fp8_max(output.dtype), 0.0f, 0,
                          nullptr, output.scale_inv};
  if (job.rows * job.cols == 0) {
    if (output.scale_inv != nullptr) launch_scale_kernel(job.scale, stream, op);
    return;
  }
  launch_cast(job, input.dtype, output.dtype, stream, op);
}

void quantize_current_scaling(const fp8kit_tensor& input, fp8kit_tensor& output,
                              const fp8kit_current_scaling_config& config, void* stream_ptr) {
  const char* op = "quantize_current_scaling";
  ScopedDevice device(input.device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  launch_zero_amax(output.amax, stream, op);
  CastJob job = make_job(input, output);
  job.amax = nullptr;  // the cast pass reads the finished amax instead
  job.pdl = true;      // right after the amax kernel
  job.scale = ScaleSource{nullptr, output.amax, fp8kit_fp8_max(output.dtype),
                          config.amax_epsilon, config.force_pow2_scale, output.scale,
                          output.scale_inv};
  const int64_t n = job.rows * job.cols;
  if (n == 0) {
    launch_scale_kernel(job.scale, stream, op);  // amax 0 -> scale 1
    return;
  }
  launch_amax(input.data, input.dtype, n, output.amax, stream, op);
  launch_cast(job, input.dtype, output.dtype, stream, op);
}

}  // namespace cuda
}  // namespace fp8kit
