// FFI handler for fp8kit_dequantize: FP8 (rowwise, or columnwise read back
// into the logical layout) times scale_inv, to float32/bfloat16/float16.
// A per-tensor `data` has one scale_inv; a block-scaled one the scales of
// the copy passed (fp8kit/block_scaling.h's layout).
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_dequantize";

ffi::Error DequantizeImpl(const Device& device, ffi::AnyBuffer data, ffi::AnyBuffer scale_inv,
                          ffi::Result<ffi::AnyBuffer> out, bool from_columnwise,
                          int32_t scaling_mode) {
  // The output has the logical shape; the FP8 input is described with it
  // and its bytes go to `data` or `columnwise_data`.
  auto output = Describe(kOp, "output", *out, device);
  if (output.has_error()) return output.error();
  auto fp8 = Describe(kOp, "data", data, device);
  if (fp8.has_error()) return fp8.error();
  if (NumElements(data.dimensions()) != fp8kit_tensor_numel(&*output)) {
    return Invalid(kOp, "data has " + std::to_string(NumElements(data.dimensions())) +
                            " elements but the output has " +
                            std::to_string(fp8kit_tensor_numel(&*output)));
  }
  auto input = DescribeFp8Copy(kOp, *output, fp8->dtype, data, scale_inv, from_columnwise,
                               scaling_mode);
  if (input.has_error()) return input.error();
  return FromStatus(fp8kit_dequantize(&*input, &*output, from_columnwise ? 1 : 0, device.stream));
}

template <typename Binding>
auto BindDequantize(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()         // data: FP8 rowwise, or columnwise (2-D)
      .template Arg<ffi::AnyBuffer>()         // scale_inv: float32, one or the copy's block scales
      .template Ret<ffi::AnyBuffer>()         // out: float32/bfloat16/float16, logical shape
      .template Attr<bool>("from_columnwise")  // from_columnwise: `data` is the columnwise copy
      .template Attr<int32_t>("scaling_mode");  // scaling_mode: fp8kit_scaling_mode code
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(dequantize, fp8kit_jax::DequantizeImpl, fp8kit_jax::BindDequantize);
