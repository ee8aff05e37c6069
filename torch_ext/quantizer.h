// Quantizer objects: turn a high-precision torch tensor into an fp8kit
// Float8Tensor in one C++ call (check, allocate through PyTorch on the
// input's device, launch on its current stream, build the Python object).
//
//   Float8Quantizer               delayed scaling: quantizes with a given
//                                 scale tensor, optionally writing amax
//   Float8CurrentScalingQuantizer current scaling: scale from this tensor's
//                                 own amax (epsilon, optional power of two)
//
// Both produce rowwise data, columnwise (transposed) data, or both.
#ifndef FP8KIT_TORCH_EXT_QUANTIZER_H_
#define FP8KIT_TORCH_EXT_QUANTIZER_H_

#include "torch_includes.h"

namespace fp8kit_torch {

class Quantizer {
 public:
  Quantizer(fp8kit_dtype fp8, bool rowwise, bool columnwise);
  virtual ~Quantizer() = default;

  // Quantizes x (checked, contiguous) into `data` / `columnwise_data`
  // (undefined when not wanted) and writes 1/scale to `scale_inv`.
  virtual void quantize_to(const at::Tensor& x, const at::Tensor& data,
                           const at::Tensor& columnwise_data, const at::Tensor& scale_inv) = 0;
  // Checks the quantizer's state tensors as a call finds them (dtype,
  // shape, device: x's).
  virtual void check_state(const char* fn, const at::Tensor& x) const {}

  fp8kit_dtype fp8;
  bool rowwise;
  bool columnwise;
};

class Float8Quantizer final : public Quantizer {
 public:
  Float8Quantizer(at::Tensor scale, std::optional<at::Tensor> amax, fp8kit_dtype fp8,
                  bool rowwise, bool columnwise);
  void quantize_to(const at::Tensor& x, const at::Tensor& data,
                   const at::Tensor& columnwise_data, const at::Tensor& scale_inv) override;
  void check_state(const char* fn, const at::Tensor& x) const override;

  at::Tensor scale;                // float32 [1]
  std::optional<at::Tensor> amax;  // float32 [1], written on every quantization
};

class Float8CurrentScalingQuantizer final : public Quantizer {
 public:
  Float8CurrentScalingQuantizer(fp8kit_dtype fp8, bool rowwise, bool columnwise,
                                double amax_epsilon, bool power_2_scale);
  void quantize_to(const at::Tensor& x, const at::Tensor& data,
                   const at::Tensor& columnwise_data, const at::Tensor& scale_inv) override;

  double amax_epsilon;
  bool power_2_scale;
};

void register_quantizers(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_QUANTIZER_H_
