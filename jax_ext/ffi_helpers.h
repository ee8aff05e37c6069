// Helpers shared by the XLA FFI handlers: turning XLA buffers into fp8kit
// descriptors, fp8kit status codes into ffi::Error, and a guard so that no
// C++ exception ever leaves a handler (XLA calls handlers through a C ABI).
#ifndef FP8KIT_JAX_EXT_FFI_HELPERS_H_
#define FP8KIT_JAX_EXT_FFI_HELPERS_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "fp8kit/fp8kit.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define FP8KIT_JAX_X86 1
#endif

namespace fp8kit_jax {

namespace ffi = xla::ffi;

// Where a handler runs. CPU handlers have no stream; CUDA handlers get XLA's
// stream and the device ordinal from the execution context.
struct Device {
  fp8kit_device_type type;
  int index;
  void* stream;
};

inline Device CpuDevice() { return Device{FP8KIT_DEVICE_CPU, 0, nullptr}; }
inline Device CudaDevice(void* stream, int32_t ordinal) {
  return Device{FP8KIT_DEVICE_CUDA, static_cast<int>(ordinal), stream};
}

// XLA element type -> fp8kit dtype; false for types fp8kit has no name for.
bool ToFp8kitDtype(ffi::DataType type, fp8kit_dtype* out);

// Short name of an XLA element type for messages ("f32", "s32", ...).
std::string XlaTypeName(ffi::DataType type);

// An ffi::Error carrying the core's message for a failed call, or success.
// With `op`, the message starts with "<op>: " (for core calls whose own
// message names a helper rather than the handler).
ffi::Error FromStatus(fp8kit_status status, const char* op = nullptr);

// InvalidArgument error prefixed with the op name: "fp8kit_quantize: ...".
ffi::Error Invalid(const char* op, const std::string& message);

// A descriptor of `buffer` (an argument, or `*result` for a result) with
// its dims as the shape (rank <= 8 checked) and its element type, which must
// map to an fp8kit dtype. `arg` names the operand in the error message.
ffi::ErrorOr<fp8kit_tensor> Describe(const char* op, const char* arg, const ffi::AnyBuffer& buffer,
                                     const Device& device);

// An operand or result by name, and whether this call uses it (an unused
// one is a placeholder: RMSNorm's beta, mean, dbeta).
struct UsedBuffer {
  const char* arg;
  ffi::AnyBuffer* buffer;
  bool used;
};

// Describe() of each used buffer into out[i]; out[i] of an unused one is
// left as it is. The first error is returned.
template <size_t N>
ffi::Error DescribeAll(const char* op, const Device& device, const UsedBuffer (&buffers)[N],
                       fp8kit_tensor (&out)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (!buffers[i].used) continue;
    auto d = Describe(op, buffers[i].arg, *buffers[i].buffer, device);
    if (d.has_error()) return d.error();
    out[i] = *d;
  }
  return ffi::Error::Success();
}

// The FP8 output descriptor of a quantization of `input`: the rowwise
// result `data` (input's shape) and/or the columnwise result (2-D [last,
// prod(leading)]), each checked when asked for; the FP8 dtype is taken
// from them (both must agree). Scale, scale_inv and amax are left NULL.
ffi::ErrorOr<fp8kit_tensor> DescribeFp8Output(const char* op, const fp8kit_tensor& input,
                                              ffi::AnyBuffer data, ffi::AnyBuffer columnwise,
                                              bool rowwise, bool want_columnwise);

// Points the copy of `t` (columnwise or not) at its block scales in
// `scales`, after checking that t's scaling mode is a block mode and that
// `scales` is float32 with exactly fp8kit_block_scale_inv_shape elements
// (the core trusts the pointer; XLA's buffers carry the size). `arg` names
// the buffer in the error message.
ffi::Error AttachBlockScales(const char* op, const char* arg, fp8kit_tensor* t, bool columnwise,
                             ffi::AnyBuffer scales);

// One stored FP8 copy of a tensor of logical shape `like` (its rank and
// shape; device and dtype from the others) as the core reads it: `data`'s
// bytes as the rowwise copy, or with from_columnwise as the columnwise one,
// and `scale_inv` as its float32 scale_inv (per-tensor) or its block
// scales (scaling_mode a block mode). Errors name `op` and "scale_inv".
ffi::ErrorOr<fp8kit_tensor> DescribeFp8Copy(const char* op, const fp8kit_tensor& like,
                                            fp8kit_dtype fp8, ffi::AnyBuffer data,
                                            ffi::AnyBuffer scale_inv, bool from_columnwise,
                                            int32_t scaling_mode);

// Element count of a dims span (1 for rank 0).
int64_t NumElements(ffi::AnyBuffer::Dimensions dims);

// The 2-D view [rows, cols] = [prod(leading), last] of a shape (rank 0
// counts as [1, 1]): the view the columnwise copy and column sums use.
void View2d(ffi::AnyBuffer::Dimensions dims, int64_t* rows, int64_t* cols);

// Device memory operations on the handler's device and stream (memcpy /
// memset on the CPU, their async CUDA forms on XLA's stream), through the
// core (fp8kit/memory.h): this module links no CUDA runtime of its own.
// `op` names the handler in errors.
ffi::Error CopyBytes(const char* op, const Device& device, void* dst, const void* src,
                     size_t bytes);
ffi::Error ZeroBytes(const char* op, const Device& device, void* dst, size_t bytes);

// CopyBytes unless dst and src are the same buffer (an aliased result).
inline ffi::Error CopyIfDistinct(const char* op, const Device& device, void* dst,
                                 const void* src, size_t bytes) {
  if (dst == src) return ffi::Error::Success();
  return CopyBytes(op, device, dst, src, bytes);
}

// XLA's CPU runtime runs its threads with denormals flushed to zero (FTZ and
// DAZ set in MXCSR / FPCR). The core's CPU reference is specified in IEEE
// arithmetic (it must match ml_dtypes and the CUDA kernels bit for bit,
// denormal inputs included), so CPU handlers run the core with the default
// IEEE mode and restore XLA's mode afterwards.
class ScopedIeeeDenormals {
 public:
  ScopedIeeeDenormals() {
#if defined(FP8KIT_JAX_X86)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ & ~(kFtz | kDaz));
#elif defined(__aarch64__)
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t ieee = saved_ & ~(uint64_t{1} << 24);  // FZ bit
    __asm__ __volatile__("msr fpcr, %0" : : "r"(ieee));
#endif
  }
  ~ScopedIeeeDenormals() {
#if defined(FP8KIT_JAX_X86)
    _mm_setcsr(saved_);
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  ScopedIeeeDenormals(const ScopedIeeeDenormals&) = delete;
  ScopedIeeeDenormals& operator=(const ScopedIeeeDenormals&) = delete;

 private:
#if defined(FP8KIT_JAX_X86)
  static constexpr unsigned kFtz = 0x8000;  // MXCSR flush-to-zero
  static constexpr unsigned kDaz = 0x0040;  // MXCSR denormals-are-zero
  unsigned saved_ = 0;
#elif defined(__aarch64__)
  uint64_t saved_ = 0;
#endif
};

// Runs `body` (returning ffi::Error) and turns any escaping C++ exception
// (std::bad_alloc from a string, say) into an ffi::Error.
template <typename Body>
ffi::Error Guarded(const char* op, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    try {
      return ffi::Error::Internal(std::string(op) + ": internal error: " + e.what());
    } catch (...) {
      return ffi::Error(ffi::ErrorCode::kInternal, "");
    }
  } catch (...) {
    return ffi::Error(ffi::ErrorCode::kInternal, "");
  }
}

}  // namespace fp8kit_jax

#endif  // FP8KIT_JAX_EXT_FFI_HELPERS_H_
