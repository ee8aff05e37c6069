#include "ffi_helpers.h"

#include <string>

namespace fp8kit_jax {

bool ToFp8kitDtype(ffi::DataType type, fp8kit_dtype* out) {
  switch (type) {
    case ffi::DataType::F32: *out = FP8KIT_FLOAT32; return true;
    case ffi::DataType::BF16: *out = FP8KIT_BFLOAT16; return true;
    case ffi::DataType::F16: *out = FP8KIT_FLOAT16; return true;
    case ffi::DataType::F8E4M3FN: *out = FP8KIT_E4M3; return true;
    case ffi::DataType::F8E5M2: *out = FP8KIT_E5M2; return true;
    case ffi::DataType::F8E8M0FNU: *out = FP8KIT_E8M0; return true;
    default: return false;
  }
}

std::string XlaTypeName(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::C64: return "complex64";
    case ffi::DataType::C128: return "complex128";
    case ffi::DataType::F8E4M3FN: return "float8_e4m3fn";
    case ffi::DataType::F8E5M2: return "float8_e5m2";
    case ffi::DataType::F8E8M0FNU: return "float8_e8m0fnu";
    default: return "XLA type " + std::to_string(static_cast<int>(type));
  }
}

ffi::Error FromStatus(fp8kit_status status) {
  if (status == FP8KIT_OK) return ffi::Error::Success();
  std::string message = fp8kit_last_error();
  if (message.empty()) message = fp8kit_status_name(status);
  switch (status) {
    case FP8KIT_INVALID_ARGUMENT:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::move(message));
    case FP8KIT_UNSUPPORTED:
      return ffi::Error(ffi::ErrorCode::kUnimplemented, std::move(message));
    default:
      return ffi::Error(ffi::ErrorCode::kInternal, std::move(message));
  }
}

ffi::Error Invalid(const char* op, const std::string& message) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + message);
}

int64_t NumElements(ffi::AnyBuffer::Dimensions dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

namespace {

ffi::ErrorOr<fp8kit_tensor> DescribeRaw(const char* op, const char* arg, ffi::DataType type,
                                        ffi::AnyBuffer::Dimensions dims, void* data,
                                        const Device& device) {
  fp8kit_dtype dtype;
  if (!ToFp8kitDtype(type, &dtype)) {
    return ffi::Unexpected(Invalid(op, std::string(arg) + " has element type " +
                                       XlaTypeName(type) + ", which fp8kit does not handle"));
  }
  if (dims.size() > FP8KIT_MAX_RANK) {
    return ffi::Unexpected(Invalid(op, std::string(arg) + " has rank " +
                                       std::to_string(dims.size()) + "; fp8kit supports ranks up to " +
                                       std::to_string(FP8KIT_MAX_RANK) + " (reshape it first)"));
  }
  int64_t shape[FP8KIT_MAX_RANK] = {0};
  for (size_t i = 0; i < dims.size(); ++i) shape[i] = dims[i];
  return fp8kit_tensor_make(device.type, device.index, dtype, static_cast<int>(dims.size()), shape,
                            data);
}

}  // namespace

ffi::ErrorOr<fp8kit_tensor> Describe(const char* op, const char* arg, const ffi::AnyBuffer& buffer,
                                     const Device& device) {
  return DescribeRaw(op, arg, buffer.element_type(), buffer.dimensions(), buffer.untyped_data(),
                     device);
}

}  // namespace fp8kit_jax
