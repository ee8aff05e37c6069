// The XLA FFI handler symbols fp8kit exports, one per op and platform, and
// the glue that gives each op one implementation for both platforms.
//
// An op's implementation is `ffi::Error Impl(const Device&, operands...)`;
// its operand list is written once, in a `BindXxx(binding)` function with
// one comment per operand; OnCpu / OnCuda adapt it to the two bindings
// (CPU: no context, IEEE denormals; CUDA: XLA's stream and device ordinal
// first).
#ifndef FP8KIT_JAX_EXT_HANDLERS_H_
#define FP8KIT_JAX_EXT_HANDLERS_H_

#include <cstdint>
#include <utility>

#include "ffi_helpers.h"
#include "xla/ffi/api/ffi.h"

namespace fp8kit_jax {

// Start of a CPU binding: no context operands.
inline auto CpuBinding() { return ffi::Ffi::Bind(); }

// Start of a CUDA binding: XLA's cudaStream_t (as void*, so this header
// needs no CUDA include) and the device ordinal the call runs on.
inline auto CudaBinding() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>();
}

template <auto Impl>
struct OnCpu {
  template <typename... Args>
  ffi::Error operator()(Args... args) const {
    ScopedIeeeDenormals ieee;
    return Guarded("fp8kit", [&] { return Impl(CpuDevice(), std::move(args)...); });
  }
};

template <auto Impl>
struct OnCuda {
  template <typename... Args>
  ffi::Error operator()(void* stream, int32_t ordinal, Args... args) const {
    return Guarded("fp8kit", [&] { return Impl(CudaDevice(stream, ordinal), std::move(args)...); });
  }
};

}  // namespace fp8kit_jax

// A CUDA handler in two forms. `fn` is called by XLA on its stream between
// the CUDA graphs XLA records for the rest of the program; `fn##_graph`
// carries ffi::Traits::kCmdBufferCompatible, so XLA may record the call into
// those graphs (by stream capture) and replay it without calling fp8kit.
// Every fp8kit CUDA handler qualifies: it only launches kernels and
// cuBLASLt calls on the given stream, takes all device memory from its
// operands (the GEMM's workspace is a result), and never syncs or queries
// the stream; the GEMM does not autotune under capture (gemm_plan.cc).
// fp8kit/jax/_registry.py picks one form per process.
#define FP8KIT_DEFINE_CUDA_HANDLER(fn, impl, binding)   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(fn, impl, binding);     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(fn##_graph, impl, binding, \
                                {::xla::ffi::Traits::kCmdBufferCompatible})

#define FP8KIT_DECLARE_CUDA_HANDLER(fn) \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(fn);   \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(fn##_graph)

// Handler symbols (defined in *_ffi.cc; the *_cuda ones only in CUDA builds).
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_amax_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_quantize_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_quantize_current_scaling_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_compute_scale_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_dequantize_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_delayed_scaling_update_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_gemm_cpu);
#ifdef FP8KIT_WITH_CUDA
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_amax_cuda);
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_quantize_cuda);
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_quantize_current_scaling_cuda);
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_compute_scale_cuda);
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_dequantize_cuda);
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_delayed_scaling_update_cuda);
FP8KIT_DECLARE_CUDA_HANDLER(fp8kit_jax_gemm_cuda);
#endif

#endif  // FP8KIT_JAX_EXT_HANDLERS_H_
