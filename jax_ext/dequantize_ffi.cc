// FFI handler for fp8kit_dequantize: FP8 (rowwise, or columnwise read back
// into the logical layout) times scale_inv, to float32/bfloat16/float16.
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_dequantize";

ffi::Error DequantizeImpl(const Device& device, ffi::AnyBuffer data,
                          ffi::Buffer<ffi::F32> scale_inv, ffi::Result<ffi::AnyBuffer> out,
                          bool from_columnwise) {
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
  if (scale_inv.element_count() != 1) {
    return Invalid(kOp, "scale_inv must hold exactly one float32");
  }
  fp8kit_tensor input = fp8kit_tensor_make(device.type, device.index, fp8->dtype, output->rank,
                                           output->shape, nullptr);
  input.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  if (from_columnwise) {
    input.columnwise_data = data.untyped_data();
  } else {
    input.data = data.untyped_data();
  }
  input.scale_inv = const_cast<float*>(scale_inv.typed_data());  // read only
  return FromStatus(fp8kit_dequantize(&input, &*output, from_columnwise ? 1 : 0, device.stream));
}

template <typename Binding>
auto BindDequantize(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()         // data: FP8 rowwise, or columnwise (2-D)
      .template Arg<ffi::Buffer<ffi::F32>>()  // scale_inv: dequantization factor, one float32
      .template Ret<ffi::AnyBuffer>()         // out: float32/bfloat16/float16, logical shape
      .template Attr<bool>("from_columnwise");  // from_columnwise: `data` is the columnwise copy
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(dequantize, fp8kit_jax::DequantizeImpl, fp8kit_jax::BindDequantize);
