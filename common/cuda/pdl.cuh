// Programmatic dependent launch (Hopper+): lets a kernel start while the
// kernel before it on the stream is still finishing, and wait for that
// kernel's results only where it needs them. The quantization ops use it
// to hide the launch gaps of their short chains (zero amax -> reduce/cast,
// amax pass -> cast pass), which at 8192x8192 are a few percent of the
// whole op.
//
// Rules that keep it correct:
//   - a kernel launched with launch_pdl() may run before its predecessor
//     (the "primary") completes; everything *before* the primary completed
//     before the primary started, so it is visible as usual;
//   - before touching anything the primary writes, the kernel calls
//     pdl_wait(), which returns once the primary has completed and its
//     writes are visible (and at once for a normal launch);
//   - pdl_trigger() in the primary allows the dependent to be scheduled
//     early; it does not publish memory.
#ifndef FP8KIT_CUDA_PDL_CUH_
#define FP8KIT_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda_check.h"

namespace fp8kit {
namespace cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `stream` allowed to overlap its predecessor. Where
// the attribute is not supported the launch is retried as a plain one;
// building with -DFP8KIT_NO_PDL makes every launch a plain one.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                const char* op, const char* what, Args&&... args) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attr;
#ifdef FP8KIT_NO_PDL
  config.numAttrs = 0;
#else
  config.numAttrs = 1;
#endif
  cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {
    (void)cudaGetLastError();
    config.numAttrs = 0;
    e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  }
  cuda_check(e, op, what);
}

// One launch of `blocks` blocks of `kernel`: with launch_pdl when `pdl`,
// else a plain one.
template <typename Params>
void launch_pdl_or_plain(void (*kernel)(Params), int64_t blocks, int threads,
                         const Params& params, bool pdl, cudaStream_t stream, const char* op,
                         const char* what) {
  if (pdl) {
    launch_pdl(kernel, dim3(unsigned(blocks)), dim3(threads), stream, op, what, params);
  } else {
    kernel<<<unsigned(blocks), threads, 0, stream>>>(params);
    check_launch(op, what);
  }
}

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_PDL_CUH_
