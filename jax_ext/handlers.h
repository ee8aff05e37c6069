// How an fp8kit op becomes an XLA FFI handler for both platforms, in one
// place per op.
//
// An op's implementation is `ffi::Error Impl(const Device&, operands...)`;
// its operand list is written once, in a `BindXxx(binding)` function with
// one comment per operand. Then one line in the op's .cc file,
//
//   FP8KIT_JAX_HANDLER(quantize, QuantizeImpl, BindQuantize);
//
// defines the CPU handler (no context, IEEE denormals), the CUDA handler
// (XLA's stream and device ordinal first; CUDA builds only) and registers
// both under the target name "fp8kit_quantize"; module.cc exports every
// registered target from `registrations()`, and fp8kit/jax/_ffi.py
// registers them with JAX. Nothing else lists the ops.
//
// The CUDA handlers are command-buffer compatible: XLA may record them into
// its CUDA graphs with the fusions around them, instead of cutting the
// graph at each fp8kit call and launching that call from the host. They
// only launch kernels and memsets on XLA's stream into buffers XLA passed.
// The exceptions (FP8KIT_JAX_HANDLER_UNCAPTURED): the GEMM, whose first call
// for a shape times cuBLASLt's candidates (events, a synchronization) and
// allocates the autotuning scratch, and the grouped ops, which copy the
// group sizes to the host and wait for the stream; a graph may hold none
// of these.
#ifndef FP8KIT_JAX_EXT_HANDLERS_H_
#define FP8KIT_JAX_EXT_HANDLERS_H_

#include <cstdint>
#include <utility>
#include <vector>

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

// The CPU form of Impl: the core's CPU reference is specified in IEEE
// arithmetic, XLA's CPU threads flush denormals (ScopedIeeeDenormals).
template <auto Impl>
struct OnCpu {
  const char* target;
  template <typename... Args>
  ffi::Error operator()(Args... args) const {
    ScopedIeeeDenormals ieee;
    return Guarded(target, [&] { return Impl(CpuDevice(), std::move(args)...); });
  }
};

// The CUDA form of Impl: the stream and device ordinal become a Device.
template <auto Impl>
struct OnCuda {
  const char* target;
  template <typename... Args>
  ffi::Error operator()(void* stream, int32_t ordinal, Args... args) const {
    return Guarded(target,
                   [&] { return Impl(CudaDevice(stream, ordinal), std::move(args)...); });
  }
};

// One exported FFI target: XLA_FFI_Handler pointers per platform.
struct HandlerEntry {
  const char* target;  // the custom-call target name seen in HLO
  void* cpu;           // for platform "cpu"
  void* cuda;          // for platform "CUDA", or nullptr in a CPU-only build
};

// Adds a target (FP8KIT_JAX_HANDLER calls it during static initialization);
// returns true so that it can initialize a static.
bool RegisterHandler(const char* target, void* cpu, void* cuda);

// Every registered target, in no particular order.
const std::vector<HandlerEntry>& Handlers();

}  // namespace fp8kit_jax

#ifdef FP8KIT_WITH_CUDA
#define FP8KIT_JAX_CUDA_HANDLER_(handler, impl, bind, target, traits)              \
  XLA_FFI_DEFINE_HANDLER(handler, ::fp8kit_jax::OnCuda<impl>{target},                \
                         bind(::fp8kit_jax::CudaBinding()), traits);
#define FP8KIT_JAX_CUDA_POINTER_(handler) reinterpret_cast<void*>(handler)
#else
#define FP8KIT_JAX_CUDA_HANDLER_(handler, impl, bind, target, traits)
#define FP8KIT_JAX_CUDA_POINTER_(handler) nullptr
#endif
#define FP8KIT_JAX_CAPTURED_ {::xla::ffi::Traits::kCmdBufferCompatible}
#define FP8KIT_JAX_UNCAPTURED_ {}

// Defines and registers the handlers of target "fp8kit_<name>" from
// `impl` (the Impl function) and `bind` (its BindXxx); at namespace scope,
// outside any namespace. The handlers are file-local function pointers
// (XLA_FFI_DEFINE_HANDLER): the registry, not the symbol table, exports them.
#define FP8KIT_JAX_HANDLER_WITH_(name, impl, bind, cuda_traits)                           \
  XLA_FFI_DEFINE_HANDLER(fp8kit_jax_##name##_cpu, ::fp8kit_jax::OnCpu<impl>{"fp8kit_" #name}, \
                         bind(::fp8kit_jax::CpuBinding()));                               \
  FP8KIT_JAX_CUDA_HANDLER_(fp8kit_jax_##name##_cuda, impl, bind, "fp8kit_" #name,         \
                           cuda_traits)                                                   \
  [[maybe_unused]] static const bool fp8kit_jax_##name##_registered =                     \
      ::fp8kit_jax::RegisterHandler("fp8kit_" #name,                                      \
                                    reinterpret_cast<void*>(fp8kit_jax_##name##_cpu),     \
                                    FP8KIT_JAX_CUDA_POINTER_(fp8kit_jax_##name##_cuda))
#define FP8KIT_JAX_HANDLER(name, impl, bind) \
  FP8KIT_JAX_HANDLER_WITH_(name, impl, bind, FP8KIT_JAX_CAPTURED_)
// A handler XLA must not record into a command buffer (see above).
#define FP8KIT_JAX_HANDLER_UNCAPTURED(name, impl, bind) \
  FP8KIT_JAX_HANDLER_WITH_(name, impl, bind, FP8KIT_JAX_UNCAPTURED_)

#endif  // FP8KIT_JAX_EXT_HANDLERS_H_
