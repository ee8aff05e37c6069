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

// Handler symbols (defined in *_ffi.cc; the *_cuda ones only in CUDA builds).
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_amax_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_quantize_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_quantize_current_scaling_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_compute_scale_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_dequantize_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_delayed_scaling_update_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_gemm_cpu);
#ifdef FP8KIT_WITH_CUDA
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_amax_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_quantize_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_quantize_current_scaling_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_compute_scale_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_dequantize_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_delayed_scaling_update_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(fp8kit_jax_gemm_cuda);
#endif

#endif  // FP8KIT_JAX_EXT_HANDLERS_H_
