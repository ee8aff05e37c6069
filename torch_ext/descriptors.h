// torch tensors <-> fp8kit descriptors: dtype mapping, devices, streams and
// the argument checks every binding shares (each message names the
// function, the argument and the fix).
#ifndef FP8KIT_TORCH_EXT_DESCRIPTORS_H_
#define FP8KIT_TORCH_EXT_DESCRIPTORS_H_

#include <optional>
#include <string>
#include <vector>

#include "torch_includes.h"

namespace fp8kit_torch {

// float32 / bfloat16 / float16 -> fp8kit dtype; nullopt for anything else.
std::optional<fp8kit_dtype> high_precision_dtype(at::ScalarType t);
// torch.float8_e4m3fn / torch.float8_e5m2 -> fp8kit dtype; nullopt otherwise.
std::optional<fp8kit_dtype> fp8_dtype_of(at::ScalarType t);
at::ScalarType torch_fp8_type(fp8kit_dtype f);
// "e4m3" / "e5m2" -> fp8kit dtype; ValueError naming `arg` otherwise.
fp8kit_dtype parse_fp8_name(const std::string& name, const char* fn, const char* arg);
const char* fp8_name(fp8kit_dtype f);  // "e4m3" / "e5m2"
// "max" / "most_recent" -> fp8kit amax reduction; ValueError naming `arg`
// otherwise.
fp8kit_amax_reduction parse_amax_reduction(const std::string& name, const char* fn,
                                           const char* arg);
const char* amax_reduction_name(fp8kit_amax_reduction r);  // "max" / "most_recent"

// The fp8kit device of a tensor (ValueError for devices other than CPU and
// CUDA, NotImplementedError for CUDA tensors in a build without CUDA).
fp8kit_device_type device_type_of(const at::Tensor& t, const char* fn, const char* arg);

// The stream fp8kit work on `device` must use: PyTorch's current CUDA stream
// of that device; nullptr on the CPU.
void* current_stream(const at::Device& device);

// Makes `device` the current CUDA device for its lifetime (no-op on CPU).
class DeviceScope {
 public:
  explicit DeviceScope(const at::Device& device) {
    if (device.is_cuda()) guard_.emplace(device);
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

// Checks (each throws a c10 error that becomes a Python exception).
// A tensor with storage (not a wrapper subclass such as a Float8Tensor).
void check_dense(const char* fn, const char* arg, const at::Tensor& t);
// float32 / bfloat16 / float16, returning the fp8kit dtype.
fp8kit_dtype check_high_precision(const char* fn, const char* arg, const at::Tensor& t);
// torch.float8_e4m3fn / torch.float8_e5m2, returning the fp8kit dtype.
fp8kit_dtype check_fp8(const char* fn, const char* arg, const at::Tensor& t);
void check_contiguous(const char* fn, const char* arg, const at::Tensor& t);
void check_same_device(const char* fn, const char* arg, const at::Tensor& t,
                       const char* ref_arg, const at::Tensor& ref);
// A float32 tensor with exactly one element, contiguous, on ref's device
// (scale, scale_inv, amax and the like).
void check_f32_scalar(const char* fn, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref);
void check_rank(const char* fn, const char* arg, const at::Tensor& t);
// The current-scaling floor of amax: a finite float >= 0 (0 disables it).
void check_amax_epsilon(const char* fn, double amax_epsilon);
// A quantizer's usage: at least one of its two copies asked for.
void check_quantizer_usage(const char* fn, bool rowwise, bool columnwise);
// A high-precision input checked (dtype, rank, device) and made contiguous
// (a copy when it is not).
at::Tensor contiguous_high_precision(const char* fn, const char* arg, const at::Tensor& x);

// The logical shape a dequantization of `data` returns: data's own (then
// `shape`, when given, must equal it), or with from_columnwise the shape
// whose columnwise layout 2-D data is (`shape`, by default the transpose).
std::vector<int64_t> dequantized_shape(const char* fn, const at::Tensor& data,
                                       bool from_columnwise,
                                       const std::optional<std::vector<int64_t>>& shape);

// A descriptor of `t` (already checked: dense, contiguous, rank <= 8) with
// the given element type and `t`'s shape and data pointer.
fp8kit_tensor describe(const at::Tensor& t, fp8kit_dtype dtype, fp8kit_device_type device_type);

// "[2, 3]" and "torch.bfloat16" for messages.
std::string shape_str(at::IntArrayRef shape);
std::string dtype_str(at::ScalarType t);
std::string device_str(const at::Device& d);

// The columnwise (transposed) shape of `shape`: [last, prod(leading)]; a
// rank-0 tensor counts as [1, 1] and a rank-1 tensor [n] as [n, 1].
std::vector<int64_t> columnwise_shape(at::IntArrayRef shape);

// Runs a C API call. On the CPU the call does the work, so the GIL is
// released around it when this thread holds it; CUDA calls only launch.
template <typename F>
fp8kit_status call_core(bool on_cpu, F&& f) {
  if (on_cpu && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    return f();
  }
  return f();
}

// A dispatcher op's stand-in for an output not asked for: its schema
// returns Tensor, never None, so a missing tensor is an empty [0] one
// (the fake kernels give it the same dtype).
inline at::Tensor or_empty(const at::Tensor& t, const at::TensorOptions& options) {
  return t.defined() ? t : at::empty({0}, options);
}
inline at::Tensor or_empty(const std::optional<at::Tensor>& t,
                           const at::TensorOptions& options) {
  return t ? *t : at::empty({0}, options);
}

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_DESCRIPTORS_H_
