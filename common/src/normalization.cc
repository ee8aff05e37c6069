// fp8kit_norm_forward and fp8kit_norm_backward: shared validation, then
// the CPU reference or the CUDA kernels (common/cuda/norm_*.cu).
#include "fp8kit/normalization.h"

#include <cmath>
#include <cstdint>

#include "error.h"
#include "fused_cast_validate.h"
#include "normalization_cpu.h"
#include "validate.h"
#include "fp8kit/linear.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

// config, x (rank >= 1, hidden a positive multiple of the GEMM alignment)
// and gamma. Sets rows and hidden.
void check_norm_inputs(const char* op, const fp8kit_norm_config* config, const fp8kit_tensor* x,
                       const fp8kit_tensor* gamma, int64_t* rows, int64_t* hidden) {
  FP8KIT_CHECK(config != nullptr, op, ": config is NULL; pass a fp8kit_norm_config");
  FP8KIT_CHECK(config->type == FP8KIT_LAYERNORM || config->type == FP8KIT_RMSNORM, op,
               ": config->type is ", int(config->type), "; use FP8KIT_LAYERNORM or FP8KIT_RMSNORM");
  FP8KIT_CHECK(std::isfinite(config->epsilon) && config->epsilon >= 0.0f, op,
               ": config->epsilon is ", config->epsilon, "; it must be finite and >= 0");
  check_tensor(op, "x", x);
  check_high_precision(op, "x", *x);
  FP8KIT_CHECK(x->rank >= 1, op, ": x has rank 0; it must be [rows, hidden] (rank >= 1)");
  check_fused_aligned(op, "x->data", x->data);
  flatten_2d(*x, rows, hidden);
  FP8KIT_CHECK(*hidden > 0 && *hidden % FP8KIT_GEMM_DIM_MULTIPLE == 0, op,
               ": x has hidden size (last dimension) ", *hidden, "; it must be a positive "
               "multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
               " (the FP8 GEMM that reads the output needs it)");
  check_vector(op, "gamma", gamma, x->dtype, *hidden, *x, "x");
  check_fused_aligned(op, "gamma->data", gamma->data);
}

// beta (LayerNorm: x's dtype, [hidden]; RMSNorm: NULL).
void check_beta(const char* op, const fp8kit_norm_config& config, const fp8kit_tensor* beta,
                int64_t hidden, const fp8kit_tensor& x) {
  if (config.type == FP8KIT_LAYERNORM) {
    FP8KIT_CHECK(beta != nullptr, op, ": beta is NULL; LayerNorm needs beta [", hidden, "]");
    check_vector(op, "beta", beta, x.dtype, hidden, x, "x");
    check_fused_aligned(op, "beta->data", beta->data);
  } else {
    FP8KIT_CHECK(beta == nullptr, op, ": beta is given but RMSNorm has no beta; pass NULL");
  }
}

// mean (LayerNorm: float32 [rows]; RMSNorm: NULL) and rsigma (float32 [rows]).
void check_norm_stats(const char* op, const fp8kit_norm_config& config, const fp8kit_tensor* mean,
                      const fp8kit_tensor* rsigma, int64_t rows, const fp8kit_tensor& x) {
  if (config.type == FP8KIT_LAYERNORM) {
    FP8KIT_CHECK(mean != nullptr, op, ": mean is NULL; LayerNorm needs mean, float32 [", rows, "]");
    check_vector(op, "mean", mean, FP8KIT_FLOAT32, rows, x, "x");
  } else {
    FP8KIT_CHECK(mean == nullptr, op, ": mean is given but RMSNorm has no mean; pass NULL");
  }
  FP8KIT_CHECK(rsigma != nullptr, op, ": rsigma is NULL; pass a float32 [", rows, "] tensor");
  check_vector(op, "rsigma", rsigma, FP8KIT_FLOAT32, rows, x, "x");
}

// dgamma / dbeta: [hidden], float32, bfloat16 or float16.
void check_param_grad(const char* op, const char* arg, const fp8kit_tensor* t, int64_t hidden,
                      const fp8kit_tensor& x) {
  FP8KIT_CHECK(t != nullptr, op, ": ", arg, " is NULL; pass a [", hidden, "] tensor");
  check_tensor(op, arg, t);
  check_high_precision(op, arg, *t);
  FP8KIT_CHECK(t->rank == 1 && t->shape[0] == hidden, op, ": ", arg, " has shape ",
               shape_string(*t), "; it must be [", hidden, "]");
  check_same_device(op, arg, *t, "x", x);
}

}  // namespace
}  // namespace fp8kit

extern "C" int64_t fp8kit_norm_backward_workspace(int64_t rows, int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return 0;
  const int64_t tile = FP8KIT_NORM_BACKWARD_TILE_ROWS;
  const int64_t tiles = (rows + tile - 1) / tile;
  return 2 * tiles * hidden;
}

extern "C" fp8kit_status fp8kit_norm_forward(const fp8kit_norm_config* config,
                                             const fp8kit_tensor* x, const fp8kit_tensor* gamma,
                                             const fp8kit_tensor* beta, fp8kit_tensor* y,
                                             fp8kit_tensor* y_fp8, const fp8kit_fused_cast* cast,
                                             fp8kit_tensor* mean, fp8kit_tensor* rsigma,
                                             void* stream) {
  return fp8kit::guard([&] {
    using namespace fp8kit;
    const char* op = "norm_forward";
    int64_t rows = 0, hidden = 0;
    check_norm_inputs(op, config, x, gamma, &rows, &hidden);
    check_beta(op, *config, beta, hidden, *x);
    if (y != nullptr) check_like(op, "y", y, x->dtype, *x, "x");
    check_optional_fused_cast(op, "y", y, "y_fp8", y_fp8, cast, nullptr, *x, "x");
    check_norm_stats(op, *config, mean, rsigma, rows, *x);
    if (x->device_type == FP8KIT_DEVICE_CPU) {
      norm_forward_cpu(*config, *x, *gamma, beta, y, y_fp8, cast, mean, *rsigma);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::norm_forward(*config, *x, *gamma, beta, y, y_fp8, cast, mean, *rsigma, stream);
#endif
    }
    (void)stream;
  });
}

extern "C" fp8kit_status fp8kit_norm_backward(const fp8kit_norm_config* config,
                                              const fp8kit_tensor* dy, const fp8kit_tensor* x,
                                              const fp8kit_tensor* mean,
                                              const fp8kit_tensor* rsigma,
                                              const fp8kit_tensor* gamma, fp8kit_tensor* dx,
                                              fp8kit_tensor* dgamma, fp8kit_tensor* dbeta,
                                              float* workspace, void* stream) {
  return fp8kit::guard([&] {
    using namespace fp8kit;
    const char* op = "norm_backward";
    int64_t rows = 0, hidden = 0;
    check_norm_inputs(op, config, x, gamma, &rows, &hidden);
    check_like(op, "dy", dy, x->dtype, *x, "x");
    check_norm_stats(op, *config, mean, rsigma, rows, *x);
    check_like(op, "dx", dx, x->dtype, *x, "x");
    check_param_grad(op, "dgamma", dgamma, hidden, *x);
    if (config->type == FP8KIT_LAYERNORM) {
      check_param_grad(op, "dbeta", dbeta, hidden, *x);
    } else {
      FP8KIT_CHECK(dbeta == nullptr, op, ": dbeta is given but RMSNorm has no beta; pass NULL");
    }
    FP8KIT_CHECK(workspace != nullptr || fp8kit_norm_backward_workspace(rows, hidden) == 0, op,
                 ": workspace is NULL; pass fp8kit_norm_backward_workspace(", rows, ", ", hidden,
                 ") floats on x's device");
    if (x->device_type == FP8KIT_DEVICE_CPU) {
      norm_backward_cpu(*config, *dy, *x, mean, *rsigma, *gamma, *dx, *dgamma, dbeta);
    } else {
#ifdef FP8KIT_WITH_CUDA
      cuda::norm_backward(*config, *dy, *x, mean, *rsigma, *gamma, *dx, *dgamma, dbeta, workspace,
                          stream);
#endif
    }
    (void)workspace;
    (void)stream;
  });
}
