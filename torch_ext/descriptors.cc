#include "descriptors.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "errors.h"

namespace fp8kit_torch {

std::optional<fp8kit_dtype> high_precision_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return FP8KIT_FLOAT32;
    case at::kBFloat16: return FP8KIT_BFLOAT16;
    case at::kHalf: return FP8KIT_FLOAT16;
    default: return std::nullopt;
  }
}

std::optional<fp8kit_dtype> fp8_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn: return FP8KIT_E4M3;
    case at::kFloat8_e5m2: return FP8KIT_E5M2;
    default: return std::nullopt;
  }
}

at::ScalarType torch_fp8_type(fp8kit_dtype f) {
  return f == FP8KIT_E5M2 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
}

fp8kit_dtype parse_fp8_name(const std::string& name, const char* fn, const char* arg) {
  if (name == "e4m3") return FP8KIT_E4M3;
  if (name == "e5m2") return FP8KIT_E5M2;
  C10_THROW_ERROR(ValueError, c10::str(fn, ": ", arg, " is '", name,
                                       "'; use 'e4m3' (float8_e4m3fn) or 'e5m2' (float8_e5m2)"));
}

const char* fp8_name(fp8kit_dtype f) { return f == FP8KIT_E5M2 ? "e5m2" : "e4m3"; }

fp8kit_amax_reduction parse_amax_reduction(const std::string& name, const char* fn,
                                           const char* arg) {
  if (name == "max") return FP8KIT_AMAX_MAX;
  if (name == "most_recent") return FP8KIT_AMAX_MOST_RECENT;
  C10_THROW_ERROR(ValueError,
                  c10::str(fn, ": ", arg, " is '", name, "'; use 'max' or 'most_recent'"));
}

const char* amax_reduction_name(fp8kit_amax_reduction r) {
  return r == FP8KIT_AMAX_MOST_RECENT ? "most_recent" : "max";
}

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string dtype_str(at::ScalarType t) {
  // torch's Python spelling, e.g. torch.bfloat16, torch.float8_e4m3fn.
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

std::string device_str(const at::Device& d) { return d.str(); }

fp8kit_device_type device_type_of(const at::Tensor& t, const char* fn, const char* arg) {
  if (t.is_cpu()) return FP8KIT_DEVICE_CPU;
  if (t.is_cuda()) {
#ifdef FP8KIT_TORCH_CUDA
    return FP8KIT_DEVICE_CUDA;
#else
    C10_THROW_ERROR(NotImplementedError,
                    c10::str(fn, ": ", arg, " is on ", device_str(t.device()),
                             " but this fp8kit build has no CUDA support; rebuild fp8kit on a "
                             "machine with a CUDA toolkit (and a CUDA build of torch) or move ",
                             arg, " to the CPU"));
#endif
  }
  C10_THROW_ERROR(ValueError, c10::str(fn, ": ", arg, " is on ", device_str(t.device()),
                                       "; fp8kit runs on CPU and CUDA tensors only (move ", arg,
                                       " with .cpu() or .cuda())"));
}

void* current_stream(const at::Device& device) {
#ifdef FP8KIT_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  (void)device;
  return nullptr;
}

void check_dense(const char* fn, const char* arg, const at::Tensor& t) {
  FP8KIT_TYPE_CHECK(t.defined(), fn, ": ", arg, " is an undefined tensor");
  // Tensor subclasses that dispatch to Python (fp8kit's Float8Tensor, other
  // wrapper subclasses) have no data of their own.
  FP8KIT_TYPE_CHECK(t.has_storage() && t.layout() == at::kStrided &&
                        !t.key_set().has(c10::DispatchKey::Python),
                    fn, ": ", arg,
                    " is a tensor without dense storage (a tensor subclass such as an fp8kit "
                    "Float8Tensor, or a sparse/meta tensor); pass a plain dense tensor, e.g. ",
                    arg, ".dequantize() for a Float8Tensor");
}

fp8kit_dtype check_high_precision(const char* fn, const char* arg, const at::Tensor& t) {
  check_dense(fn, arg, t);
  const auto d = high_precision_dtype(t.scalar_type());
  FP8KIT_TYPE_CHECK(d.has_value(), fn, ": ", arg, " has dtype ", dtype_str(t.scalar_type()),
                    "; expected torch.float32, torch.bfloat16 or torch.float16 (convert it, e.g. ",
                    arg, ".float())");
  return *d;
}

fp8kit_dtype check_fp8(const char* fn, const char* arg, const at::Tensor& t) {
  check_dense(fn, arg, t);
  const auto d = fp8_dtype_of(t.scalar_type());
  FP8KIT_TYPE_CHECK(d.has_value(), fn, ": ", arg, " has dtype ", dtype_str(t.scalar_type()),
                    "; expected FP8 data (torch.float8_e4m3fn or torch.float8_e5m2) as returned "
                    "by fp8kit.torch.quantize");
  return *d;
}

void check_contiguous(const char* fn, const char* arg, const at::Tensor& t) {
  FP8KIT_VALUE_CHECK(t.is_contiguous(), fn, ": ", arg,
                     " is not contiguous; fp8kit writes dense row-major buffers, pass ", arg,
                     ".contiguous() (or a fresh tensor)");
}

void check_same_device(const char* fn, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref) {
  FP8KIT_VALUE_CHECK(t.device() == ref.device(), fn, ": ", arg, " is on ", device_str(t.device()),
                     " but ", ref_arg, " is on ", device_str(ref.device()), "; move ", arg,
                     " to ", device_str(ref.device()), " (", arg, ".to(", ref_arg, ".device))");
}

void check_f32_scalar(const char* fn, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref) {
  check_dense(fn, arg, t);
  FP8KIT_TYPE_CHECK(t.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()),
                    "; it must be a torch.float32 tensor with one element");
  FP8KIT_VALUE_CHECK(t.numel() == 1, fn, ": ", arg, " has shape ", shape_str(t.sizes()),
                     "; it must hold exactly one float32 (shape [1])");
  check_same_device(fn, arg, t, ref_arg, ref);
}

void check_rank(const char* fn, const char* arg, const at::Tensor& t) {
  FP8KIT_VALUE_CHECK(t.dim() <= FP8KIT_MAX_RANK, fn, ": ", arg, " has ", t.dim(),
                     " dimensions; fp8kit supports up to ", FP8KIT_MAX_RANK,
                     " (reshape it first)");
}

void check_amax_epsilon(const char* fn, double amax_epsilon) {
  FP8KIT_VALUE_CHECK(std::isfinite(amax_epsilon) && amax_epsilon >= 0.0, fn,
                     ": amax_epsilon is ", amax_epsilon,
                     "; it must be a finite float >= 0 (0 disables it)");
}

void check_quantizer_usage(const char* fn, bool rowwise, bool columnwise) {
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; a quantizer must produce at least "
                     "one copy");
}

at::Tensor contiguous_high_precision(const char* fn, const char* arg, const at::Tensor& x) {
  check_high_precision(fn, arg, x);
  check_rank(fn, arg, x);
  device_type_of(x, fn, arg);
  return x.contiguous();
}

std::vector<int64_t> dequantized_shape(const char* fn, const at::Tensor& data,
                                       bool from_columnwise,
                                       const std::optional<std::vector<int64_t>>& shape) {
  if (!from_columnwise) {
    FP8KIT_VALUE_CHECK(!shape || data.sizes().equals(*shape), fn, ": shape ",
                       shape ? shape_str(*shape) : "", " differs from data's shape ",
                       shape_str(data.sizes()),
                       "; shape is only for from_columnwise=True (reshape the result instead)");
    check_rank(fn, "data", data);
    return data.sizes().vec();
  }
  FP8KIT_VALUE_CHECK(data.dim() == 2, fn, ": from_columnwise=True needs 2-D columnwise data "
                     "[last dim, prod(leading dims)], got shape ", shape_str(data.sizes()));
  std::vector<int64_t> logical =
      shape ? *shape : std::vector<int64_t>{data.size(1), data.size(0)};
  FP8KIT_VALUE_CHECK(logical.size() <= FP8KIT_MAX_RANK, fn, ": shape has ", logical.size(),
                     " dimensions; fp8kit supports up to ", FP8KIT_MAX_RANK);
  for (int64_t s : logical) {
    FP8KIT_VALUE_CHECK(s >= 0, fn, ": shape ", shape_str(logical), " has a negative dimension");
  }
  const auto cw = columnwise_shape(logical);
  FP8KIT_VALUE_CHECK(cw[0] == data.size(0) && cw[1] == data.size(1), fn, ": shape ",
                     shape_str(logical), " has columnwise layout ", shape_str(cw),
                     " but data has shape ", shape_str(data.sizes()),
                     "; pass the shape of the tensor that was quantized");
  return logical;
}

fp8kit_tensor describe(const at::Tensor& t, fp8kit_dtype dtype, fp8kit_device_type device_type) {
  fp8kit_tensor d;
  std::memset(&d, 0, sizeof(d));
  d.device_type = device_type;
  d.device_index = device_type == FP8KIT_DEVICE_CUDA ? t.device().index() : 0;
  d.dtype = dtype;
  d.rank = static_cast<int>(t.dim());
  const auto sizes = t.sizes();
  for (int i = 0; i < d.rank; ++i) d.shape[i] = sizes[i];
  d.data = t.data_ptr();
  d.scaling_mode = FP8KIT_SCALING_NONE;
  return d;
}

std::vector<int64_t> columnwise_shape(at::IntArrayRef shape) {
  if (shape.empty()) return {1, 1};
  int64_t leading = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) leading *= shape[i];
  return {shape.back(), leading};
}

}  // namespace fp8kit_torch
