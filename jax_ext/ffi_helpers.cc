#include "ffi_helpers.h"

#include <string>
#include <utility>

namespace fp8kit_jax {

bool ToFp8kitDtype(ffi::DataType type, fp8kit_dtype* out) {
  switch (type) {
    case ffi::DataType::F32: *out = FP8KIT_FLOAT32; return true;
    case ffi::DataType::BF16: *out = FP8KIT_BFLOAT16; return true;
    case ffi::DataType::F16: *out = FP8KIT_FLOAT16; return true;
    case ffi::DataType::F8E4M3FN: *out = FP8KIT_E4M3; return true;
    case ffi::DataType::F8E5M2: *out = FP8KIT_E5M2; return true;
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

ffi::Error FromStatus(fp8kit_status status, const char* op) {
  if (status == FP8KIT_OK) return ffi::Error::Success();
  std::string message = fp8kit_last_error();
  if (message.empty()) message = fp8kit_status_name(status);
  if (op != nullptr) message = std::string(op) + ": " + message;
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

ffi::Error AttachBlockScales(const char* op, const char* arg, fp8kit_tensor* t, bool columnwise,
                             ffi::AnyBuffer scales) {
  int64_t shape[2] = {0, 0};
  if (auto err = FromStatus(fp8kit_block_scale_inv_shape(t, columnwise ? 1 : 0, shape));
      err.failure()) {
    return err;
  }
  if (scales.element_type() != ffi::DataType::F32 ||
      NumElements(scales.dimensions()) != shape[0] * shape[1]) {
    return Invalid(op, std::string(arg) + " must be float32 [" + std::to_string(shape[0]) +
                           ", " + std::to_string(shape[1]) + "] (fp8kit_block_scale_inv_shape), "
                           "got " + XlaTypeName(scales.element_type()) + " with " +
                           std::to_string(NumElements(scales.dimensions())) + " elements");
  }
  float* data = static_cast<float*>(scales.untyped_data());
  if (columnwise) {
    t->columnwise_block_scale_inv = data;
  } else {
    t->block_scale_inv = data;
  }
  return ffi::Error::Success();
}

ffi::ErrorOr<fp8kit_tensor> DescribeFp8Copy(const char* op, const fp8kit_tensor& like,
                                            fp8kit_dtype fp8, ffi::AnyBuffer data,
                                            ffi::AnyBuffer scale_inv, bool from_columnwise,
                                            int32_t scaling_mode) {
  fp8kit_tensor t = fp8kit_tensor_make(like.device_type, like.device_index, fp8, like.rank,
                                       like.shape, nullptr);
  t.scaling_mode = static_cast<fp8kit_scaling_mode>(scaling_mode);
  if (from_columnwise) {
    t.columnwise_data = data.untyped_data();
  } else {
    t.data = data.untyped_data();
  }
  if (t.scaling_mode != FP8KIT_SCALING_PER_TENSOR) {
    // The core refuses a mode that is not a block mode either.
    if (auto err = AttachBlockScales(op, "scale_inv", &t, from_columnwise, scale_inv);
        err.failure()) {
      return ffi::Unexpected(err);
    }
  } else if (scale_inv.element_type() != ffi::DataType::F32 ||
             scale_inv.element_count() != 1) {
    return ffi::Unexpected(Invalid(op, "scale_inv must hold exactly one float32"));
  } else {
    t.scale_inv = static_cast<float*>(scale_inv.untyped_data());  // read only
  }
  return t;
}

int64_t NumElements(ffi::AnyBuffer::Dimensions dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

void View2d(ffi::AnyBuffer::Dimensions dims, int64_t* rows, int64_t* cols) {
  *cols = dims.size() > 0 ? dims[dims.size() - 1] : 1;
  *rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) *rows *= dims[i];
}

ffi::Error CopyBytes(const char* op, const Device& device, void* dst, const void* src,
                     size_t bytes) {
  return FromStatus(fp8kit_copy_bytes(device.type, device.index, dst, src, bytes, device.stream),
                    op);
}

ffi::Error ZeroBytes(const char* op, const Device& device, void* dst, size_t bytes) {
  return FromStatus(fp8kit_zero_bytes(device.type, device.index, dst, bytes, device.stream), op);
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
      return ffi::Unexpected(
          Invalid(op, "rowwise and columnwise results have different FP8 types"));
    }
    dtype = d;
    have_dtype = true;
    if (NumElements(buf->dimensions()) != numel) {
      return ffi::Unexpected(Invalid(op, "an FP8 result has " +
                                             std::to_string(NumElements(buf->dimensions())) +
                                             " elements but the input has " +
                                             std::to_string(numel)));
    }
  }
  if (rowwise && data.dimensions().size() != static_cast<size_t>(input.rank)) {
    return ffi::Unexpected(Invalid(op, "the rowwise result must have the input's shape"));
  }
  if (want_columnwise) {
    const int64_t last = input.rank > 0 ? input.shape[input.rank - 1] : 1;
    const auto d = columnwise.dimensions();
    if (d.size() != 2 || d[0] != last || (last != 0 && d[1] != numel / last)) {
      return ffi::Unexpected(Invalid(op, "the columnwise result must be 2-D [last, "
                                         "prod(leading)] = [" + std::to_string(last) + ", " +
                                         std::to_string(last != 0 ? numel / last : 0) + "]"));
    }
  }
  fp8kit_tensor out = fp8kit_tensor_make(input.device_type, input.device_index, dtype, input.rank,
                                         input.shape, rowwise ? data.untyped_data() : nullptr);
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  out.columnwise_data = want_columnwise ? columnwise.untyped_data() : nullptr;
  return out;
}

}  // namespace fp8kit_jax
