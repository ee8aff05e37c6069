// torch.ops.fp8kit.cast_statistics: what casting a high-precision tensor
// into one FP8 copy of it lost (fp8kit/statistics.h), as a dispatcher op (a
// fragment of the fp8kit library of dispatcher_ops.cc) with one kernel for
// CPU and CUDA; its fake kernel is in fp8kit/torch/_fake_ops.py.
// fp8kit.torch.cast_statistics calls this op eagerly and under tracing
// alike. Unlike the ops of ops.h it has no pybind11 twin: that would only
// skip the dispatcher's few microseconds, which a diagnostic does not need,
// and with one path torch.compile traces exactly what eager mode runs.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "block_ops.h"
#include "core_calls.h"
#include "descriptors.h"
#include "errors.h"

namespace fp8kit_torch {
namespace {

constexpr const char* kStatsFn = "fp8kit::cast_statistics";

using Statistics = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// "per_row" is a per-tensor copy read with one scale_inv per row (a grouped
// copy's rows, each its group's scale: fp8kit_cast_statistics_of_rows).
constexpr const char* kPerRow = "per_row";

fp8kit_scaling_mode parse_scaling_mode(const std::string& name) {
  if (name == "per_tensor" || name == kPerRow) return FP8KIT_SCALING_PER_TENSOR;
  FP8KIT_VALUE_CHECK(name == "block_1x128" || name == "block_128x128", kStatsFn,
                     ": scaling_mode is '", name, "'; use 'per_tensor' (a Float8Tensor's), "
                     "'block_1x128' or 'block_128x128' (a Float8BlockTensor's), or 'per_row' (a "
                     "grouped copy's rows, scale_inv one per row)");
  return parse_block_mode(name, kStatsFn, "scaling_mode");
}

// scale_inv under "per_row": float32, one per row of x's [prod(leading),
// last] view, contiguous, on x's device; the rowwise copy read.
void check_row_scales(const at::Tensor& scale_inv, const at::Tensor& x, bool from_columnwise) {
  FP8KIT_VALUE_CHECK(!from_columnwise, kStatsFn,
                     ": scaling_mode 'per_row' reads the rowwise copy; pass it with "
                     "from_columnwise=False");
  FP8KIT_TYPE_CHECK(scale_inv.scalar_type() == at::kFloat, kStatsFn, ": scale_inv has dtype ",
                    scale_inv.scalar_type(), "; pass float32 (one scale_inv per row)");
  check_same_device(kStatsFn, "scale_inv", scale_inv, "x", x);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  FP8KIT_VALUE_CHECK(scale_inv.numel() == rows, kStatsFn,
                     ": scale_inv has ", scale_inv.numel(), " elements but x (shape ",
                     shape_str(x.sizes()), ") has ", rows, " rows; under 'per_row' pass one "
                     "scale_inv per row");
  check_contiguous(kStatsFn, "scale_inv", scale_inv);
}

// `data` is x's FP8 copy in the layout read (the core describes the copy
// with x's shape, so a copy of another shape must be refused here).
fp8kit_dtype check_copy_of(const at::Tensor& data, const at::Tensor& x, bool from_columnwise) {
  const fp8kit_dtype f = check_fp8(kStatsFn, "data", data);
  check_same_device(kStatsFn, "data", data, "x", x);
  const std::vector<int64_t> want =
      from_columnwise ? columnwise_shape(x.sizes()) : x.sizes().vec();
  FP8KIT_VALUE_CHECK(data.sizes() == at::IntArrayRef(want), kStatsFn, ": data has shape ",
                     shape_str(data.sizes()), " but x has shape ", shape_str(x.sizes()),
                     ", whose ", from_columnwise ? "columnwise" : "rowwise", " copy is ",
                     shape_str(want), "; pass the FP8 copy of x itself");
  check_contiguous(kStatsFn, "data", data);
  return f;
}

Statistics cast_statistics_op(const at::Tensor& x_in, const at::Tensor& data,
                              const at::Tensor& scale_inv, const std::string& scaling_mode,
                              bool from_columnwise) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const fp8kit_scaling_mode mode = parse_scaling_mode(scaling_mode);
  const at::Tensor x = contiguous_high_precision(kStatsFn, "x", x_in);
  device_type_of(x, kStatsFn, "x");  // a CPU or CUDA tensor
  const fp8kit_dtype fp8 = check_copy_of(data, x, from_columnwise);
  const bool per_row = scaling_mode == kPerRow;
  if (per_row) {
    check_row_scales(scale_inv, x, from_columnwise);
  } else if (mode == FP8KIT_SCALING_PER_TENSOR) {
    check_f32_scalar(kStatsFn, "scale_inv", scale_inv, "x", x);
    check_contiguous(kStatsFn, "scale_inv", scale_inv);
  } else {
    check_block_scales(kStatsFn, "scale_inv", scale_inv,
                       block_scale_inv_shape(x.sizes(), mode, from_columnwise), "x", x);
  }
  DeviceScope scope(x.device());
  const auto f32 = x.options().dtype(at::kFloat);
  const auto u32 = x.options().dtype(at::kUInt32);
  at::Tensor amax = at::empty({}, f32), error_sq = at::empty({}, f32),
             norm_sq = at::empty({}, f32);
  at::Tensor underflow = at::empty({}, u32), saturated = at::empty({}, u32);
  const fp8kit_cast_statistics out{amax.data_ptr<float>(),
                                   static_cast<unsigned int*>(underflow.data_ptr()),
                                   static_cast<unsigned int*>(saturated.data_ptr()),
                                   error_sq.data_ptr<float>(), norm_sq.data_ptr<float>(),
                                   /*workspace: cast_statistics_into's*/ nullptr};
  cast_statistics_into(x, fp8, mode, data, from_columnwise, scale_inv.data_ptr<float>(), out,
                       per_row ? &scale_inv : nullptr);
  // The core counts in 32 bits; torch does integer arithmetic (a count
  // over numel, say) in int64, on the same stream as the core's writes.
  return {amax, underflow.to(at::kLong), saturated.to(at::kLong), error_sq, norm_sq};
}

}  // namespace
}  // namespace fp8kit_torch

TORCH_LIBRARY_FRAGMENT(fp8kit, m) {
  m.def(
      "cast_statistics(Tensor x, Tensor data, Tensor scale_inv, str scaling_mode=\"per_tensor\", "
      "bool from_columnwise=False) -> (Tensor amax, Tensor underflow, Tensor saturated, Tensor "
      "error_sq, Tensor norm_sq)");
}

TORCH_LIBRARY_IMPL(fp8kit, CPU, m) { m.impl("cast_statistics", &fp8kit_torch::cast_statistics_op); }

#ifdef FP8KIT_TORCH_CUDA
TORCH_LIBRARY_IMPL(fp8kit, CUDA, m) {
  m.impl("cast_statistics", &fp8kit_torch::cast_statistics_op);
}
#endif
