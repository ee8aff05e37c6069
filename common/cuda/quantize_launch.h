// Launchers shared between the quantization .cu files (amax.cu,
// compute_scale.cu, quantize.cu). Each checks its launch.
#ifndef FP8KIT_CUDA_QUANTIZE_LAUNCH_H_
#define FP8KIT_CUDA_QUANTIZE_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8kit/tensor.h"

namespace fp8kit {
namespace cuda {

struct ScaleSource;

// atomicMax of max |x| over `n` elements of `data` into *amax, which the
// caller zeroed on `stream`. n > 0.
void launch_amax(const void* data, fp8kit_dtype dtype, int64_t n, float* amax,
                 cudaStream_t stream, const char* op);

// One thread: computes the scale as a cast kernel would (read_scale) and
// writes scale_out / scale_inv_out. Used by compute_scale and for empty
// tensors, where no cast kernel runs.
void launch_scale_kernel(const ScaleSource& source, cudaStream_t stream, const char* op);

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_QUANTIZE_LAUNCH_H_
