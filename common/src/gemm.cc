// fp8kit_gemm: validation and TN canonicalization (gemm_problem.cc), then the
// CPU reference or cuBLASLt.
#include "fp8kit/gemm.h"

#include <cstring>

#include "error.h"
#include "gemm_cpu.h"
#include "gemm_problem.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" {

fp8kit_gemm_config fp8kit_gemm_config_default(void) {
  fp8kit_gemm_config c;
  std::memset(&c, 0, sizeof(c));
  c.trans_a = 0;
  c.trans_b = 0;
  c.alpha = 1.0f;
  c.beta = 0.0f;
  c.epilogue = FP8KIT_EPILOGUE_DEFAULT;
  c.bias = nullptr;
  c.bias_dtype = FP8KIT_BFLOAT16;
  c.gelu_aux = nullptr;
  c.use_split_accumulator = 1;
  c.workspace = nullptr;
  c.workspace_bytes = 0;
  c.bias_numel = 0;
  c.gelu_aux_numel = 0;
  return c;
}

size_t fp8kit_gemm_workspace_size(fp8kit_device_type device_type) {
#ifdef FP8KIT_WITH_CUDA
  if (device_type == FP8KIT_DEVICE_CUDA) return fp8kit::cuda::gemm_workspace_size();
#endif
  (void)device_type;
  return 0;
}

fp8kit_status fp8kit_gemm(const fp8kit_tensor* a, const fp8kit_tensor* b, fp8kit_tensor* d,
                          const fp8kit_gemm_config* config, void* stream) {
  return fp8kit::guard([&] {
    const fp8kit::GemmProblem problem = fp8kit::make_gemm_problem(a, b, d, config);
    if (problem.device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::gemm_cpu(problem);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::gemm(problem, stream);
#endif
    }
    (void)stream;
  });
}

}  // extern "C"
