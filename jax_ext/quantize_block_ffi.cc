// FFI handler for fp8kit_quantize_block_scaling: one float32 scale per
// 1x128 tile or 128x128 block (the rule and the scale layout are
// fp8kit/block_scaling.h's), rowwise and/or columnwise copies in one pass.
//
// As in quantize_ffi.cc, a copy not asked for is still an operand: the
// Python side passes an empty (0,) placeholder for its data and its scales
// and the handler leaves both alone.
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_quantize_block_scaling";

ffi::Error QuantizeBlockImpl(const Device& device, ffi::AnyBuffer x,
                             ffi::Result<ffi::AnyBuffer> data,
                             ffi::Result<ffi::AnyBuffer> columnwise,
                             ffi::Result<ffi::AnyBuffer> block_scale_inv,
                             ffi::Result<ffi::AnyBuffer> columnwise_block_scale_inv,
                             bool rowwise, bool want_columnwise, int32_t scaling_mode,
                             float amax_epsilon, bool power_2_scale) {
  auto input = Describe(kOp, "x", x, device);
  if (input.has_error()) return input.error();
  auto output = DescribeFp8Output(kOp, *input, *data, *columnwise, rowwise, want_columnwise);
  if (output.has_error()) return output.error();
  output->scaling_mode = static_cast<fp8kit_scaling_mode>(scaling_mode);
  if (rowwise) {
    if (auto err = AttachBlockScales(kOp, "the block_scale_inv result", &*output, false,
                                     *block_scale_inv);
        err.failure()) {
      return err;
    }
  }
  if (want_columnwise) {
    if (auto err = AttachBlockScales(kOp, "the columnwise_block_scale_inv result", &*output,
                                     true, *columnwise_block_scale_inv);
        err.failure()) {
      return err;
    }
  }
  fp8kit_current_scaling_config config;
  config.amax_epsilon = amax_epsilon;
  config.power_2_scale = power_2_scale ? 1 : 0;
  return FromStatus(fp8kit_quantize_block_scaling(&*input, &*output, &config, device.stream));
}

template <typename Binding>
auto BindQuantizeBlock(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()        // x: float32/bfloat16/float16, any shape
      .template Ret<ffi::AnyBuffer>()        // data: FP8, x's shape (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()        // columnwise: FP8 [last, prod(leading)] (or (0,))
      .template Ret<ffi::AnyBuffer>()        // block_scale_inv: float32 scales of data (or (0,))
      .template Ret<ffi::AnyBuffer>()        // columnwise_block_scale_inv: of columnwise (or (0,))
      .template Attr<bool>("rowwise")        // rowwise: write data and block_scale_inv
      .template Attr<bool>("columnwise")     // columnwise: write the columnwise copy and scales
      .template Attr<int32_t>("scaling_mode")  // scaling_mode: BLOCK_1X128 or BLOCK_128X128 code
      .template Attr<float>("amax_epsilon")  // amax_epsilon: lower bound on each block's amax
      .template Attr<bool>("power_2_scale");  // power_2_scale: round each scale down to 2^k
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(quantize_block_scaling, fp8kit_jax::QuantizeBlockImpl,
                   fp8kit_jax::BindQuantizeBlock);
