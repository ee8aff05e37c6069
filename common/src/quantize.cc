// fp8kit_quantize, fp8kit_quantize_current_scaling and its form for
// several tensors: shared validation, then the CPU reference or the CUDA
// kernels.
#include "fp8kit/quantize.h"

#include <string>

#include "column_sums_cpu.h"
#include "error.h"
#include "quantize_cpu.h"
#include "quantize_validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

extern "C" fp8kit_status fp8kit_quantize(const fp8kit_tensor* input, fp8kit_tensor* output,
                                         void* stream) {
  return fp8kit::guard([&] {
    fp8kit::check_quantize_args("quantize", input, output, /*current_scaling=*/false);
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_delayed_cpu(*input, *output);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize(*input, *output, stream);
#endif
    }
    (void)stream;
  });
}

extern "C" fp8kit_status fp8kit_quantize_current_scaling(
    const fp8kit_tensor* input, fp8kit_tensor* output,
    const fp8kit_current_scaling_config* config, const fp8kit_column_sums* sums, void* stream) {
  return fp8kit::guard([&] {
    const char* op = "quantize_current_scaling";
    fp8kit::check_quantize_args(op, input, output, /*current_scaling=*/true);
    fp8kit::check_current_scaling_config(op, config);
    if (sums != nullptr && sums->sums == nullptr) sums = nullptr;
    if (sums != nullptr) {
      fp8kit::check_column_sums(op, "sums", "input", "output->columnwise_data", *input, *output,
                                *sums);
    }
    if (input->device_type == FP8KIT_DEVICE_CPU) {
      fp8kit::quantize_current_scaling_cpu(*input, *output, *config);
      if (sums != nullptr) fp8kit::column_sums_cpu(*input, *sums);
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize_current_scaling(*input, *output, *config, sums, stream);
#endif
    }
    (void)stream;
  });
}

namespace fp8kit {
namespace {

constexpr int kMaxMany = 64;

// Each tensor as fp8kit_quantize_current_scaling checks it (its index
// added to the message), all on inputs[0]'s device, no scale pointer
// shared. No string is built unless a check fails or a tensor has sums:
// a small layer calls this on every step.
void check_many_args(const char* op, const fp8kit_tensor* inputs, const fp8kit_tensor* outputs,
                     const fp8kit_column_sums* sums, int count,
                     const fp8kit_current_scaling_config* config) {
  FP8KIT_CHECK(count >= 0 && count <= kMaxMany, op, ": count is ", count, "; pass 0..", kMaxMany,
               " tensors per call");
  FP8KIT_CHECK(count == 0 || (inputs != nullptr && outputs != nullptr), op,
               ": inputs and outputs must each be an array of count (", count, ") entries");
  check_current_scaling_config(op, config);
  for (int i = 0; i < count; ++i) {
    try {
      check_quantize_args(op, &inputs[i], &outputs[i], /*current_scaling=*/true);
    } catch (const Error& e) {
      fail(e.status(), e.what(), " (tensor ", i, ")");
    }
    if (sums != nullptr && sums[i].sums != nullptr) {
      const std::string at = "[" + std::to_string(i) + "]";
      check_column_sums(op, "sums" + at, "inputs" + at, "outputs" + at + ".columnwise_data",
                        inputs[i], outputs[i], sums[i]);
    }
    FP8KIT_CHECK(inputs[i].device_type == inputs[0].device_type &&
                     inputs[i].device_index == inputs[0].device_index,
                 op, ": inputs[", i, "] is on another device than inputs[0]; one call runs on "
                 "one device");
    const float* mine[3] = {outputs[i].amax, outputs[i].scale, outputs[i].scale_inv};
    for (int j = 0; j < i; ++j) {
      const float* theirs[3] = {outputs[j].amax, outputs[j].scale, outputs[j].scale_inv};
      for (const float* a : mine) {
        for (const float* b : theirs) {
          FP8KIT_CHECK(a != b, op, ": outputs[", j, "] and outputs[", i, "] share an amax, "
                       "scale or scale_inv buffer; each tensor of a call needs its own");
        }
      }
    }
  }
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_quantize_current_scaling_many(
    const fp8kit_tensor* inputs, fp8kit_tensor* outputs, const fp8kit_column_sums* sums,
    int count, const fp8kit_current_scaling_config* config, void* stream) {
  return fp8kit::guard([&] {
    const char* op = "quantize_current_scaling_many";
    fp8kit::check_many_args(op, inputs, outputs, sums, count, config);
    if (count == 0) return;
    if (inputs[0].device_type == FP8KIT_DEVICE_CPU) {
      for (int i = 0; i < count; ++i) {
        fp8kit::quantize_current_scaling_cpu(inputs[i], outputs[i], *config);
        if (sums != nullptr && sums[i].sums != nullptr) {
          fp8kit::column_sums_cpu(inputs[i], sums[i]);
        }
      }
    } else {
#ifdef FP8KIT_WITH_CUDA
      fp8kit::cuda::quantize_current_scaling_many(inputs, outputs, sums, count, *config, stream);
#endif
    }
    (void)stream;
  });
}
