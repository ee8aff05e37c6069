// Launchers shared between the quantization .cu files (amax.cu,
// compute_scale.cu, quantize.cu, quantize_fused.cu). Each checks its
// launch.
#ifndef FP8KIT_CUDA_QUANTIZE_LAUNCH_H_
#define FP8KIT_CUDA_QUANTIZE_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8kit/tensor.h"

namespace fp8kit {
namespace cuda {

struct ScaleSource;

// *amax = 0 by a one-thread kernel that lets the next kernel start early
// (pdl.cuh); that next kernel must be launched with launch_pdl and wait
// before touching *amax (amax_block_commit does).
void launch_zero_amax(float* amax, cudaStream_t stream, const char* op);

// atomicMax of max |x| over `n` elements of `data` into *amax. Must come
// right after launch_zero_amax(amax) on `stream` (it is launched as that
// kernel's programmatic dependent). n > 0.
void launch_amax(const void* data, fp8kit_dtype dtype, int64_t n, float* amax,
                 cudaStream_t stream, const char* op);

// The amaxes of count (<= 64) tensors, all on this device:
// *outputs[i].amax = max |inputs[i]| in two launches (zero all, then one
// reduction over all, programmatic dependent of the zeroing). The next
// kernel on `stream` may be launched with launch_pdl and read the amaxes
// after pdl_wait.
void launch_amax_many(const fp8kit_tensor* inputs, const fp8kit_tensor* outputs, int count,
                      cudaStream_t stream, const char* op);

// One thread: computes the scale as a cast kernel would (read_scale) and
// writes scale_out / scale_inv_out. Used by compute_scale and for empty
// tensors, where no cast kernel runs.
void launch_scale_kernel(const ScaleSource& source, cudaStream_t stream, const char* op);

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_QUANTIZE_LAUNCH_H_
