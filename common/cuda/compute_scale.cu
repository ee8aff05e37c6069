// fp8kit::cuda::compute_scale and the one-thread scale kernel (also used
// for empty tensors, where no cast kernel runs to write the scales).
#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "quantize_device.cuh"
#include "quantize_launch.h"

namespace fp8kit {
namespace cuda {
namespace {

__global__ void scale_kernel(const ScaleSource source) { (void)read_scale(source, true); }

}  // namespace

void launch_scale_kernel(const ScaleSource& source, cudaStream_t stream, const char* op) {
  scale_kernel<<<1, 1, 0, stream>>>(source);
  check_launch(op, "launching the scale kernel");
}

void compute_scale(const float* amax, float* scale, float* scale_inv, float fp8_max,
                   const fp8kit_current_scaling_config& config, int device_index,
                   void* stream) {
  const char* op = "compute_scale";
  ScopedDevice device(device_index, op);
  launch_scale_kernel(current_scale_source(amax, fp8_max, config, scale, scale_inv),
                      static_cast<cudaStream_t>(stream), op);
}

}  // namespace cuda
}  // namespace fp8kit
