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
// tensor flattened to [prod(leading), last] and stored transposed; the
// Python side shapes it [last, *leading], which is the same bytes.
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

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

// The FP8 output descriptor shared by both quantize flavours: rowwise and
// columnwise results checked against the input, the FP8 dtype taken from
// whichever is requested (both must agree).
ffi::ErrorOr<fp8kit_tensor> DescribeFp8Output(const char* op, const fp8kit_tensor& input,
                                              ffi::AnyBuffer data, ffi::AnyBuffer columnwise,
                                              bool rowwise, bool want_columnwise) {
  if (!rowwise && !want_columnwise) {
    return ffi::Unexpected(Invalid(op, "ask for rowwise and/or columnwise output"));
  }
  const int64_t numel = fp8kit_tensor_numel(&input);
  fp8kit_dtype dtype = FP8KIT_E4M3;
  bool have_dtype = false;
  const std::pair<bool, ffi::AnyBuffer*> outs[] = {{rowwise, &data},
                                                   {want_columnwise, &columnwise}};
  for (const auto& [wanted, buf] : outs) {
    if (!wanted) continue;
    fp8kit_dtype d;
    if (!ToFp8kitDtype(buf->element_type(), &d) || (d != FP8KIT_E4M3 && d != FP8KIT_E5M2)) {
      return ffi::Unexpected(Invalid(op, "the FP8 result has element type " +
                                             XlaTypeName(buf->element_type()) +
                                             "; expected float8_e4m3fn or float8_e5m2"));
    }
    if (have_dtype && d != dtype) {
      return ffi::Unexpected(Invalid(op, "rowwise and columnwise results have different FP8 types"));
    }
    dtype = d;
    have_dtype = true;
    if (NumElements(buf->dimensions()) != numel) {
      return ffi::Unexpected(Invalid(op, "an FP8 result has " +
                                             std::to_string(NumElements(buf->dimensions())) +
                                             " elements but the input has " + std::to_string(numel)));
    }
  }
  if (rowwise && data.dimensions().size() != static_cast<size_t>(input.rank)) {
    return ffi::Unexpected(Invalid(op, "the rowwise result must have the input's shape"));
  }
  fp8kit_tensor out = fp8kit_tensor_make(input.device_type, input.device_index, dtype, input.rank,
                                         input.shape, rowwise ? data.untyped_data() : nullptr);
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  out.columnwise_data = want_columnwise ? columnwise.untyped_data() : nullptr;
  return out;
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
      .template Ret<ffi::AnyBuffer>()          // columnwise: FP8 [last, *leading] (or (0,))
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale_inv: 1/scale, one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // amax: max |x|, one float32
      .template Attr<bool>("rowwise")          // rowwise: write `data`
      .template Attr<bool>("columnwise");      // columnwise: write `columnwise`
}

constexpr char kCurrent[] = "fp8kit_quantize_current_scaling";

ffi::Error QuantizeCurrentImpl(const Device& device, ffi::AnyBuffer x,
                               ffi::Result<ffi::AnyBuffer> data,
                               ffi::Result<ffi::AnyBuffer> columnwise, F32Result scale,
                               F32Result scale_inv, F32Result amax, bool rowwise,
                               bool want_columnwise, float amax_epsilon, bool force_pow2_scale) {
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
  config.force_pow2_scale = force_pow2_scale ? 1 : 0;
  return FromStatus(fp8kit_quantize_current_scaling(&*input, &*output, &config, device.stream));
}

template <typename Binding>
auto BindQuantizeCurrent(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // x: float32/bfloat16/float16, any shape
      .template Ret<ffi::AnyBuffer>()          // data: FP8, x's shape (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()          // columnwise: FP8 [last, *leading] (or (0,))
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale: fp8_max / max(amax, epsilon), one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // scale_inv: 1/scale, one float32
      .template Ret<ffi::Buffer<ffi::F32>>()   // amax: max |x|, one float32
      .template Attr<bool>("rowwise")          // rowwise: write `data`
      .template Attr<bool>("columnwise")       // columnwise: write `columnwise`
      .template Attr<float>("amax_epsilon")    // amax_epsilon: lower bound on amax (0: none)
      .template Attr<bool>("force_pow2_scale");  // force_pow2_scale: round scale down to 2^k
}

constexpr char kComputeScale[] = "fp8kit_compute_scale";

ffi::Error ComputeScaleImpl(const Device& device, ffi::Buffer<ffi::F32> amax, F32Result scale,
                            F32Result scale_inv, int32_t fp8_dtype, float amax_epsilon,
                            bool force_pow2_scale) {
  for (auto [arg, count] : {std::pair<const char*, int64_t>{"amax", amax.element_count()},
                            {"scale result", scale->element_count()},
                            {"scale_inv result", scale_inv->element_count()}}) {
    if (auto err = CheckScalar(kComputeScale, arg, count); err.failure()) return err;
  }
  fp8kit_current_scaling_config config;
  config.amax_epsilon = amax_epsilon;
  config.force_pow2_scale = force_pow2_scale ? 1 : 0;
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
      .template Attr<bool>("force_pow2_scale");  // force_pow2_scale: round scale down to 2^k
}

}  // namespace
}  // namespace fp8kit_jax

using fp8kit_jax::ComputeScaleImpl;
using fp8kit_jax::QuantizeCurrentImpl;
using fp8kit_jax::QuantizeImpl;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_quantize_cpu, fp8kit_jax::OnCpu<QuantizeImpl>{},
                              fp8kit_jax::BindQuantize(fp8kit_jax::CpuBinding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_quantize_current_scaling_cpu,
                              fp8kit_jax::OnCpu<QuantizeCurrentImpl>{},
                              fp8kit_jax::BindQuantizeCurrent(fp8kit_jax::CpuBinding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_compute_scale_cpu, fp8kit_jax::OnCpu<ComputeScaleImpl>{},
                              fp8kit_jax::BindComputeScale(fp8kit_jax::CpuBinding()));
#ifdef FP8KIT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_quantize_cuda, fp8kit_jax::OnCuda<QuantizeImpl>{},
                              fp8kit_jax::BindQuantize(fp8kit_jax::CudaBinding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_quantize_current_scaling_cuda,
                              fp8kit_jax::OnCuda<QuantizeCurrentImpl>{},
                              fp8kit_jax::BindQuantizeCurrent(fp8kit_jax::CudaBinding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fp8kit_jax_compute_scale_cuda, fp8kit_jax::OnCuda<ComputeScaleImpl>{},
                              fp8kit_jax::BindComputeScale(fp8kit_jax::CudaBinding()));
#endif
