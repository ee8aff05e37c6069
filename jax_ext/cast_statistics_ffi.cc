// FFI handler for fp8kit_cast_statistics_of: what the cast of x into one
// FP8 copy of it lost (amax, underflow and saturation counts, sums of
// squared error and of x^2; fp8kit/statistics.h). The copy is read with
// one scale_inv (per-tensor) or with that copy's block scales; with
// per_row, a per-tensor rowwise copy with one scale_inv per row (a grouped
// copy's: fp8kit_cast_statistics_of_rows).
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_cast_statistics";

// The core describes the copy with x's shape, so `data` must have the
// shape of the copy read: x's, or the columnwise [last, prod(leading)].
ffi::Error CheckCopyShape(ffi::AnyBuffer x, ffi::AnyBuffer data, bool from_columnwise) {
  const auto got = data.dimensions();
  bool ok;
  if (from_columnwise) {
    int64_t rows = 0, cols = 0;
    View2d(x.dimensions(), &rows, &cols);
    ok = got.size() == 2 && got[0] == cols && got[1] == rows;
  } else {
    const auto want = x.dimensions();
    ok = got.size() == want.size();
    for (size_t i = 0; ok && i < want.size(); ++i) ok = got[i] == want[i];
  }
  if (ok) return ffi::Error::Success();
  return Invalid(kOp, std::string("data does not have the shape of x's ") +
                          (from_columnwise ? "columnwise copy [last, prod(leading)]" : "shape"));
}

ffi::Error CastStatisticsImpl(const Device& device, ffi::AnyBuffer x, ffi::AnyBuffer data,
                              ffi::AnyBuffer scale_inv, ffi::Result<ffi::Buffer<ffi::F32>> amax,
                              ffi::Result<ffi::Buffer<ffi::U32>> underflow,
                              ffi::Result<ffi::Buffer<ffi::U32>> saturated,
                              ffi::Result<ffi::Buffer<ffi::F32>> error_sq,
                              ffi::Result<ffi::Buffer<ffi::F32>> norm_sq,
                              ffi::Result<ffi::Buffer<ffi::U8>> workspace, bool from_columnwise,
                              int32_t scaling_mode, bool per_row) {
  auto input = Describe(kOp, "x", x, device);
  if (input.has_error()) return input.error();
  auto fp8 = Describe(kOp, "data", data, device);
  if (fp8.has_error()) return fp8.error();
  if (auto err = CheckCopyShape(x, data, from_columnwise); err.failure()) return err;
  for (size_t n : {amax->element_count(), underflow->element_count(),
                   saturated->element_count(), error_sq->element_count(),
                   norm_sq->element_count()}) {
    if (n != 1) return Invalid(kOp, "each of the five results must hold exactly one value");
  }
  if (workspace->element_count() != FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES) {
    return Invalid(kOp, "the workspace result must be uint8 [CAST_STATISTICS_WORKSPACE_BYTES]");
  }
  const fp8kit_cast_statistics out{amax->typed_data(), underflow->typed_data(),
                                   saturated->typed_data(), error_sq->typed_data(),
                                   norm_sq->typed_data(), workspace->untyped_data()};
  if (per_row) {
    if (from_columnwise || scaling_mode != FP8KIT_SCALING_PER_TENSOR) {
      return Invalid(kOp, "per_row reads a per-tensor rowwise copy");
    }
    auto rows = Describe(kOp, "scale_inv", scale_inv, device);
    if (rows.has_error()) return rows.error();
    fp8kit_tensor quantized = *input;  // x's logical shape, the copy's bytes
    quantized.dtype = fp8->dtype;
    quantized.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    quantized.data = data.untyped_data();
    return FromStatus(fp8kit_cast_statistics_of_rows(&*input, &quantized, &*rows, &out,
                                                     device.stream));
  }
  // x's logical shape; the copy's bytes go to `data` or `columnwise_data`.
  auto quantized = DescribeFp8Copy(kOp, *input, fp8->dtype, data, scale_inv, from_columnwise,
                                   scaling_mode);
  if (quantized.has_error()) return quantized.error();
  return FromStatus(fp8kit_cast_statistics_of(&*input, &*quantized, from_columnwise ? 1 : 0, &out,
                                              device.stream));
}

template <typename Binding>
auto BindCastStatistics(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // x: float32/bfloat16/float16, any shape
      .template Arg<ffi::AnyBuffer>()          // data: x's FP8 copy, rowwise or columnwise (2-D)
      .template Arg<ffi::AnyBuffer>()          // scale_inv: float32, one, one per row (per_row)
                                               // or the copy's block scales
      .template Ret<ffi::Buffer<ffi::F32>>()   // amax: max |x| (NaN if any NaN), scalar
      .template Ret<ffi::Buffer<ffi::U32>>()   // underflow: finite x != 0 cast to +-0
      .template Ret<ffi::Buffer<ffi::U32>>()   // saturated: finite x cast to +-fp8_max
      .template Ret<ffi::Buffer<ffi::F32>>()   // error_sq: sum of (q * scale_inv - x)^2
      .template Ret<ffi::Buffer<ffi::F32>>()   // norm_sq: sum of x^2 (finite x)
      .template Ret<ffi::Buffer<ffi::U8>>()    // workspace: the CUDA kernels' scratch
      .template Attr<bool>("from_columnwise")  // from_columnwise: `data` is the columnwise copy
      .template Attr<int32_t>("scaling_mode")  // scaling_mode: fp8kit_scaling_mode code
      .template Attr<bool>("per_row");         // per_row: scale_inv holds one per row of x
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER(cast_statistics, fp8kit_jax::CastStatisticsImpl,
                   fp8kit_jax::BindCastStatistics);
