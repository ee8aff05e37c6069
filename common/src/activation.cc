// fp8kit_activation_forward and fp8kit_activation_backward: shared
// validation, then the CPU reference or the CUDA kernels
// (common/cuda/activation.cu).
#include "fp8kit/activation.h"

#include <cstdint>
#include <string>

#include "activation_cpu.h"
#include "error.h"
#include "fp8kit/linear.h"
#include "fused_cast_validate.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

// act known; h a high-precision tensor of rank >= 1 whose last dimension
// is F (GELU) or 2F (SwiGLU) with F a positive multiple of the GEMM
// alignment. Returns `like`: a descriptor with h's leading dimensions and
// last dimension F (the shape of a and d_a).
fp8kit_tensor check_h(const char* op, fp8kit_activation act, const fp8kit_tensor* h) {
  FP8KIT_CHECK(act == FP8KIT_GELU || act == FP8KIT_SWIGLU, op, ": act is ", int(act),
               "; use FP8KIT_GELU or FP8KIT_SWIGLU");
  check_tensor(op, "h", h);
  check_high_precision(op, "h", *h);
  FP8KIT_CHECK(h->rank >= 1, op, ": h has rank 0; it must be [rows, ",
               act == FP8KIT_SWIGLU ? "2F]" : "F]", " (rank >= 1)");
  check_fused_aligned(op, "h->data", h->data);
  const int64_t last = h->shape[h->rank - 1];
  const int64_t multiple = act == FP8KIT_SWIGLU ? 2 * FP8KIT_GEMM_DIM_MULTIPLE
                                                : FP8KIT_GEMM_DIM_MULTIPLE;
  FP8KIT_CHECK(last > 0 && last % multiple == 0, op, ": h has last dimension ", last, "; ",
               act == FP8KIT_SWIGLU ? "SwiGLU's h is [gate | up], 2F wide, with F"
                                    : "GELU's h is F wide, with F",
               " a positive multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
               " (the FP8 GEMM that reads the output needs it)");
  fp8kit_tensor like = *h;
  if (act == FP8KIT_SWIGLU) like.shape[like.rank - 1] = last / 2;
  return like;
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_activation_forward(fp8kit_activation act, const fp8kit_tensor* h,
                                                   fp8kit_tensor* a, fp8kit_tensor* a_fp8,
                                                   const fp8kit_fused_cast* cast, void* stream) {
  return fp8kit::guard([&] {
    using namespace fp8kit;
    const char* op = "activation_forward";
    const fp8kit_tensor a_like = check_h(op, act, h);
    const char* a_name = act == FP8KIT_SWIGLU ? "h with the last dimension halved" : "h";
    if (a != nullptr) check_like(op, "a", a, h->dtype, a_like, a_name);
    check_optional_fused_cast(op, "a", a, "a_fp8", a_fp8, cast, nullptr, a_like, a_name);
    if (h->device_type == FP8KIT_DEVICE_CPU) {
      activation_forward_cpu(act, *h, a, a_fp8, cast);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::activation_forward(act, *h, a, a_fp8, cast, stream);
#endif
    }
    (void)stream;
  });
}

extern "C" fp8kit_status fp8kit_activation_backward(fp8kit_activation act,
                                                    const fp8kit_tensor* d_a,
                                                    const fp8kit_tensor* h, fp8kit_tensor* dh,
                                                    fp8kit_tensor* dh_fp8,
                                                    const fp8kit_fused_cast* cast,
                                                    const fp8kit_column_sums* sums,
                                                    void* stream) {
  return fp8kit::guard([&] {
    using namespace fp8kit;
    const char* op = "activation_backward";
    const fp8kit_tensor a_like = check_h(op, act, h);
    const char* a_name = act == FP8KIT_SWIGLU ? "h with the last dimension halved" : "h";
    check_like(op, "d_a", d_a, h->dtype, a_like, a_name);
    if (dh != nullptr) check_like(op, "dh", dh, h->dtype, *h, "h");
    if (sums != nullptr && sums->sums == nullptr) sums = nullptr;
    check_optional_fused_cast(op, "dh", dh, "dh_fp8", dh_fp8, cast, sums, *h, "h");
    if (h->device_type == FP8KIT_DEVICE_CPU) {
      activation_backward_cpu(act, *d_a, *h, dh, dh_fp8, cast, sums);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::activation_backward(act, *d_a, *h, dh, dh_fp8, cast, sums, stream);
#endif
    }
    (void)stream;
  });
}
