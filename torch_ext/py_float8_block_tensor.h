// Builds fp8kit.torch.float8_block_tensor.Float8BlockTensor objects from
// C++ (the wrapper and its cached properties: py_wrapper.h). The attribute
// names must match Float8BlockTensor._FIELDS (checked on first use).
#ifndef FP8KIT_TORCH_EXT_PY_FLOAT8_BLOCK_TENSOR_H_
#define FP8KIT_TORCH_EXT_PY_FLOAT8_BLOCK_TENSOR_H_

#include "block_ops.h"
#include "torch_includes.h"

namespace fp8kit_torch {

// A Float8BlockTensor of logical `shape` and nominal (high-precision)
// `dtype` on `device`, holding the copies in `b` (undefined: not held), its
// FP8 format, scaling mode and quantizer (None allowed).
pybind11::object make_float8_block_tensor(at::IntArrayRef shape, at::ScalarType dtype,
                                          const at::Device& device, const BlockBuffers& b,
                                          fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                                          pybind11::handle quantizer, bool requires_grad);

// The buffers and the scaling mode of a Float8BlockTensor object.
BlockBuffers float8_block_parts(pybind11::handle t, const char* fn, const char* arg,
                                fp8kit_scaling_mode* mode);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_PY_FLOAT8_BLOCK_TENSOR_H_
