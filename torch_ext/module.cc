// fp8kit._torch_ext: the pybind11 module behind fp8kit.torch.
#include "block_ops.h"
#include "block_quantizer.h"
#include "errors.h"
#include "fused_ops.h"
#include "linear.h"
#include "ops.h"
#include "quantizer.h"
#include "torch_includes.h"

PYBIND11_MODULE(_torch_ext, m) {
  m.doc() = "fp8kit's PyTorch extension: FP8 ops on torch tensors (use fp8kit.torch)";
  fp8kit_torch::register_exception_translator();
  fp8kit_torch::register_ops(m);
  fp8kit_torch::register_quantizers(m);
  fp8kit_torch::register_block_ops(m);
  fp8kit_torch::register_block_quantizer(m);
  fp8kit_torch::register_linear(m);
  fp8kit_torch::register_normalization(m);
  fp8kit_torch::register_activation(m);
  fp8kit_torch::register_fused_layer_ops(m);
  fp8kit_torch::register_fused_linear(m);
}
