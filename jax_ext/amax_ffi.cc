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

FP8KIT_JAX_HANDLER(amax, fp8kit_jax::AmaxImpl, fp8kit_jax::BindAmax);
