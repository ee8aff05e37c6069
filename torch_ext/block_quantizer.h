// Float8BlockQuantizer: turns a high-precision torch tensor into an fp8kit
// Float8BlockTensor in one C++ call (check, allocate through PyTorch on the
// input's device, quantize on its current stream, build the Python object).
// One scale per 1x128 tile ("block_1x128": activations and gradients) or
// per 128x128 block ("block_128x128": weights), from that block's own amax;
// rowwise copy, columnwise copy or both, each with its scales.
//
// Not a subclass of Quantizer (whose objects make per-tensor Float8Tensors):
// a block-scaled tensor has no per-tensor scale_inv.
#ifndef FP8KIT_TORCH_EXT_BLOCK_QUANTIZER_H_
#define FP8KIT_TORCH_EXT_BLOCK_QUANTIZER_H_

#include "torch_includes.h"

namespace fp8kit_torch {

struct Float8BlockQuantizer {
  fp8kit_dtype fp8;
  fp8kit_scaling_mode mode;  // BLOCK_1X128 or BLOCK_128X128
  bool rowwise;
  bool columnwise;
  double amax_epsilon;
  bool power_2_scale;
};

void register_block_quantizer(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_BLOCK_QUANTIZER_H_
