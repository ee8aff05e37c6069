// FFI handlers for per-tensor quantization:
//   fp8kit_quantize                  scale given (delayed scaling)
//   fp8kit_quantize_current_scaling  scale from this tensor's amax
//   fp8kit_compute_scale             scale from an amax (for amaxes reduced
//                                    across devices before the cast)
//
// Outputs that were not asked for (rowwise data when rowwise=false,
// columnwise data when columnwise=false) are still operands, so that every
// call has one fixed signature: the Python side passes an empty (0,) array
// there and the handler leaves it alone. The columnwise result is the
// tensor viewed as [prod(leading), last] and transposed: [last,
// prod(leading)] (fp8kit/tensor.h's rule, whatever the rank).
//
// Current scaling can also write the column sums of that 2-D view (a
// Linear's bias gradient, from dy's cast); their scratch is the uint8
// workspace result (scratch.h).
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"
#include "scratch.h"

namespace fp8kit_jax {
namespace {

using F32Result = ffi::Result<ffi::Buffer<ffi::F32>>;

ffi::Error CheckScalar(const char* op, const char* arg, int64_t count) {
  if (count != 1) {
    return Invalid(op, std::string(arg) + " must hold exactly one float32, got " +
                           std::to_string(count) + " elements");
  }
  return ffi::Error::Success();
}

constexpr char kQuantize[] = "fp8kit_quantize";

ffi::Error QuantizeImpl(const Device& device, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                        ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> columnwise,
                        F32Result scale_inv, F32Result amax, bool rowwise, bool want_columnwise) {
  auto input = Describe(kQuantize, "x", x, device);
  if (input.has_error()) return input.error();
  for (auto [arg, count] : {std::pair<const char*, int64_t>{"scale", scale.element_count()},
                            {"scale_inv result", scale_inv->element_count()},
                            {"amax result", amax->element_count()}}) {
    if (auto err = CheckScalar(kQuantize, arg, count); err.failure()) return err;
  }
  auto output = DescribeFp8Output(kQuantize, *input, *data, *columnwise, rowwise, want_columnwise);
  if (output.has_error()) return output.error();
  output->scale = const_cast<float*>(scale.typed_data());  // read only
  output->scale_inv = scale_inv->typed_data();
  output->amax = amax->typed_data();
  return FromStatus(fp8kit_quantize(&*input, &*output, device.stream));
}

template <typename Binding>
auto BindQuantize(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // x: float32/bfloat16/float16, any shape
      .template Arg<ffi::Buffer<ffi::F32>>()   // scale: the quantization scale, one float32
      .template Ret<ffi::AnyBuffer>()          // data: FP8, x's shape (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()          // columnwise: FP8 [last, prod(leading)] (or (0,))
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale_inv: 1/scale, one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // amax: max |x|, one float32
      .template Attr<bool>("rowwise")          // rowwise: write `data`
      .template Attr<bool>("columnwise");      // columnwise: write `columnwise`
}

constexpr char kCurrent[] = "fp8kit_quantize_current_scaling";

ffi::Error QuantizeCurrentImpl(const Device& device, ffi::AnyBuffer x,
                               ffi::Result<ffi::AnyBuffer> data,
                               ffi::Result<ffi::AnyBuffer> columnwise, F32Result scale,
                               F32Result scale_inv, F32Result amax,
                               ffi::Result<ffi::AnyBuffer> sums,
                               ffi::Result<ffi::AnyBuffer> workspace, bool rowwise,
                               bool want_columnwise, bool want_sums, float amax_epsilon,
                               bool power_2_scale) {
  auto input = Describe(kCurrent, "x", x, device);
  if (input.has_error()) return input.error();
  for (auto [arg, count] : {std::pair<const char*, int64_t>{"scale result", scale->element_count()},
                            {"scale_inv result", scale_inv->element_count()},
                            {"amax result", amax->element_count()}}) {
    if (auto err = CheckScalar(kCurrent, arg, count); err.failure()) return err;
  }
  auto output = DescribeFp8Output(kCurrent, *input, *data, *columnwise, rowwise, want_columnwise);
  if (output.has_error()) return output.error();
  output->scale = scale->typed_data();
  output->scale_inv = scale_inv->typed_data();
  output->amax = amax->typed_data();
  fp8kit_current_scaling_config config;
  config.amax_epsilon = amax_epsilon;
  config.power_2_scale = power_2_scale ? 1 : 0;
  if (!want_sums) {
    return FromStatus(
        fp8kit_quantize_current_scaling(&*input, &*output, &config, nullptr, device.stream));
  }
  // The column sums' scratch (scratch.h): tile counters zeroed, partials.
  int64_t rows = 0, cols = 0;
  View2d(x.dimensions(), &rows, &cols);
  const ScratchLayout layout({ScratchTensor{rows, cols, true}}, /*with_state=*/false);
  fp8kit_column_sums column_sums{};
  if (!ToFp8kitDtype(sums->element_type(), &column_sums.dtype) ||
      sums->element_count() != static_cast<size_t>(cols)) {
    return Invalid(kCurrent, "the column sums must be [" + std::to_string(cols) +
                                 "] float32, bfloat16 or float16");
  }
  if (workspace->size_bytes() < layout.bytes()) {
    return Invalid(kCurrent, "the workspace result has " +
                                 std::to_string(workspace->size_bytes()) + " bytes; column sums "
                                 "need " + std::to_string(layout.bytes()));
  }
  void* base = workspace->untyped_data();
  if (auto err = ZeroBytes(kCurrent, device, base, layout.zeroed_bytes()); err.failure()) {
    return err;
  }
  column_sums.sums = sums->untyped_data();
  column_sums.partials = layout.sum_partials(base, 0);
  column_sums.counters = layout.sum_counters(base, 0);
  return FromStatus(
      fp8kit_quantize_current_scaling(&*input, &*output, &config, &column_sums, device.stream));
}

template <typename Binding>
auto BindQuantizeCurrent(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // x: float32/bfloat16/float16, any shape
      .template Ret<ffi::AnyBuffer>()          // data: FP8, x's shape (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()          // columnwise: FP8 [last, prod(leading)] (or (0,))
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale: fp8_max / max(amax, epsilon), one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale_inv: 1/scale, one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // amax: max |x|, one float32
      .template Ret<ffi::AnyBuffer>()          // sums: [last] column sums of x's 2-D view (or (0,))
      .template Ret<ffi::AnyBuffer>()          // workspace: uint8, the column sums' scratch
      .template Attr<bool>("rowwise")          // rowwise: write `data`
      .template Attr<bool>("columnwise")       // columnwise: write `columnwise`
      .template Attr<bool>("sums")             // sums: write `sums` (needs columnwise)
      .template Attr<float>("amax_epsilon")    // amax_epsilon: lower bound on amax (0: none)
      .template Attr<bool>("power_2_scale");   // power_2_scale: round scale down to 2^k
}

constexpr char kComputeScale[] = "fp8kit_compute_scale";

ffi::Error ComputeScaleImpl(const Device& device, ffi::Buffer<ffi::F32> amax, F32Result scale,
                            F32Result scale_inv, int32_t fp8_dtype, float amax_epsilon,
                            bool power_2_scale) {
  for (auto [arg, count] : {std::pair<const char*, int64_t>{"amax", amax.element_count()},
                            {"scale result", scale->element_count()},
                            {"scale_inv result", scale_inv->element_count()}}) {
    if (auto err = CheckScalar(kComputeScale, arg, count); err.failure()) return err;
  }
  fp8kit_current_scaling_config config;
  config.amax_epsilon = amax_epsilon;
  config.power_2_scale = power_2_scale ? 1 : 0;
  return FromStatus(fp8kit_compute_scale(amax.typed_data(), scale->typed_data(),
                                         scale_inv->typed_data(),
                                         static_cast<fp8kit_dtype>(fp8_dtype), &config,
                                         device.type, device.index, device.stream));
}

template <typename Binding>
auto BindComputeScale(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::Buffer<ffi::F32>>()   // amax: one float32 (already reduced)
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale: one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale_inv: 1/scale, one float32
      .template Attr<int32_t>("fp8_dtype")     // fp8_dtype: fp8kit_dtype code (E4M3 or E5M2)
      .template Attr<float>("amax_epsilon")    // amax_epsilon: lower bound on amax (0: none)
      .template Attr<bool>("power_2_scale");   // power_2_scale: round scale down to 2^k
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(quantize, fp8kit_jax::QuantizeImpl, fp8kit_jax::BindQuantize);
FP8KIT_JAX_HANDLER(quantize_current_scaling, fp8kit_jax::QuantizeCurrentImpl,
                   fp8kit_jax::BindQuantizeCurrent);
FP8KIT_JAX_HANDLER(compute_scale, fp8kit_jax::ComputeScaleImpl, fp8kit_jax::BindComputeScale);
