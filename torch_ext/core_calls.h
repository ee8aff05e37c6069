// Thin C++ wrappers over the fp8kit C API for already-checked torch
// buffers: fill a descriptor, pick the stream, call, turn a failed status
// into an exception. Shared by the low-level bindings (ops.cc), the
// quantizer objects (quantizer.cc) and the Linear layer (linear.cc), so
// each C API op is called from exactly one place.
#ifndef FP8KIT_TORCH_EXT_CORE_CALLS_H_
#define FP8KIT_TORCH_EXT_CORE_CALLS_H_

#include "descriptors.h"
#include "torch_includes.h"

// Names each fp8kit call for torch.profiler (free when not profiling), so a
// profile shows where the host time of a Linear call goes.
#define FP8KIT_PROFILE_SCOPE(name) RECORD_FUNCTION(name, c10::ArrayRef<const c10::IValue>{})

namespace fp8kit_torch {

// Device pointers of one per-tensor scaling triple (any may be null where
// the op allows it).
struct ScalePtrs {
  float* scale = nullptr;
  float* scale_inv = nullptr;
  float* amax = nullptr;
};

// Quantizes contiguous high-precision `x` into the given FP8 buffers
// (`data`: x's shape, `columnwise_data`: columnwise_shape(x); either may be
// undefined, not both). current == nullptr: the scale at s.scale; else
// current scaling, which also writes s.scale and, when `sums` is given,
// x's column sums (fp8kit_quantize_current_scaling).
void quantize_into(const at::Tensor& x, fp8kit_dtype fp8, const at::Tensor& data,
                   const at::Tensor& columnwise_data, ScalePtrs s,
                   const fp8kit_current_scaling_config* current,
                   const fp8kit_column_sums* sums = nullptr);

// Allocates FP8 buffers for x's rowwise / columnwise data (undefined when
// not requested) through PyTorch's allocator on x's device.
at::Tensor alloc_rowwise(const at::Tensor& x, fp8kit_dtype fp8);
at::Tensor alloc_columnwise(const at::Tensor& x, fp8kit_dtype fp8);

// out (contiguous, high precision, the logical shape) = q * scale_inv,
// from rowwise or columnwise data `q` of the logical shape.
void dequantize_into(const at::Tensor& q, bool from_columnwise, at::IntArrayRef logical_shape,
                     fp8kit_dtype fp8, const float* scale_inv, const at::Tensor& out);

// columnwise (contiguous, [cols, rows]) = the transpose of contiguous FP8
// `data`, flattened to [rows, cols] (fp8kit_columnwise_from_rowwise).
void columnwise_from_rowwise_into(const at::Tensor& data, fp8kit_dtype fp8,
                                  const at::Tensor& columnwise);

// Writes max|x| of contiguous high-precision x to `amax` (device pointer).
void amax_into(const at::Tensor& x, float* amax);

// The statistics of the cast of contiguous high-precision `x` into its FP8
// copy `data` (x's shape, or columnwise_shape(x) with from_columnwise),
// whose scale_inv (per tensor) or block scales (`mode` a block mode) are at
// `scales`, written where `out` points (fp8kit_cast_statistics_of; the
// CUDA workspace is taken here, out.workspace is not read). With
// row_scale_inv (float32, one per row of the rowwise copy `data`, per
// tensor) the copy is read with those instead
// (fp8kit_cast_statistics_of_rows).
void cast_statistics_into(const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                          const at::Tensor& data, bool from_columnwise, float* scales,
                          const fp8kit_cast_statistics& out,
                          const at::Tensor* row_scale_inv = nullptr);

// One fp8kit_delayed_scaling_update call on `device`.
void delayed_update(const fp8kit_delayed_scaling_state* states, int count,
                    const fp8kit_delayed_scaling_config& config, const at::Device& device);

// One tensor of a fused delayed-scaling quantize+update call: contiguous
// high-precision `x`, its FP8 outputs (either may be undefined, not both),
// where this quantization's 1/scale goes, and the scaling state.
struct DelayedQuantizeItem {
  const at::Tensor* x;
  fp8kit_dtype fp8;
  const at::Tensor* data;
  const at::Tensor* columnwise_data;
  float* scale_inv;
  fp8kit_delayed_quantize_state state;
  fp8kit_column_sums sums;  // sums.sums == NULL: no column sums
};

// One fp8kit_quantize_delayed_update call for `count` items on `device`
// (record: whether the pass computes gradients, see fp8kit/linear.h).
void quantize_delayed_update_into(const DelayedQuantizeItem* items, int count,
                                  const fp8kit_delayed_scaling_config& config, bool record,
                                  const at::Device& device);

// One tensor of a current-scaling call for several: as quantize_into's
// arguments, its own scale, scale_inv and amax all set.
struct CurrentQuantizeItem {
  const at::Tensor* x;
  fp8kit_dtype fp8;
  const at::Tensor* data;
  const at::Tensor* columnwise_data;
  ScalePtrs s;
  fp8kit_column_sums sums;  // sums.sums == NULL: no column sums
};

// One fp8kit_quantize_current_scaling_many call for `count` items on
// `device`: the launches of one tensor's current scaling for all of them.
void quantize_current_into(const CurrentQuantizeItem* items, int count,
                           const fp8kit_current_scaling_config& config, const at::Device& device);

// A GEMM operand: rows x cols is the logical 2-D shape of its rowwise
// layout; data / columnwise_data may be null (not both).
fp8kit_tensor gemm_operand(const at::Device& device, fp8kit_dtype fp8, int64_t rows, int64_t cols,
                           void* data, void* columnwise_data, const float* scale_inv);

// fp8kit_gemm with PyTorch's current stream and a cached per-device
// workspace tensor (config.workspace is filled in here).
void gemm_call(const fp8kit_tensor& a, const fp8kit_tensor& b, fp8kit_tensor& d,
               fp8kit_gemm_config config, const at::Device& device);

// The cached answer of fp8kit_supports_non_tn_fp8_gemm for `device`.
bool supports_non_tn(const at::Device& device);

// The device a capability query (fn) asks about: a CUDA device without an
// index is the current one. Errors name fn for a build without CUDA and
// for a device that is neither CPU nor CUDA.
at::Device capability_query_device(const char* fn, const at::Device& device);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_CORE_CALLS_H_
