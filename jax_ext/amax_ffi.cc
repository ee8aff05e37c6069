// FFI handler for fp8kit_amax: max |x| over the whole input.
#include "ffi_helpers.h"
#include "handlers.h"

#include <utility>

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_amax";

ffi::Error AmaxImpl(const Device& device, ffi::AnyBuffer x,
                    ffi::Result<ffi::Buffer<ffi::F32>> amax) {
  auto input = Describe(kOp, "x", x, device);
  if (input.has_error()) return input.error();
  if (amax->element_count() != 1) {
    return Invalid(kOp, "the amax result must hold exactly one float32");
  }
  return FromStatus(fp8kit_amax(&*input, amax->typed_data(), device.stream));
}

template <typename Binding>
auto BindAmax(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()         // x: float32/bfloat16/float16, any shape
      .template Ret<ffi::Buffer<ffi::F32>>();  // amax: max |x| as a float32 scalar (NaN if any NaN)
}

}  // namespace
}  // namespace fp8kit_jax

using fp8kit_jax::AmaxImpl;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_amax_cpu, fp8kit_jax::OnCpu<AmaxImpl>{},
                              fp8kit_jax::BindAmax(fp8kit_jax::CpuBinding()));
#ifdef FP8KIT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_amax_cuda, fp8kit_jax::OnCuda<AmaxImpl>{},
                              fp8kit_jax::BindAmax(fp8kit_jax::CudaBinding()));
#endif
