// The low-level functions of fp8kit._torch_ext: one binding per C API op,
// with torch tensors in and out. fp8kit.torch wraps them; benchmarks and
// tests call them directly.
#ifndef FP8KIT_TORCH_EXT_OPS_H_
#define FP8KIT_TORCH_EXT_OPS_H_

#include "torch_includes.h"

namespace fp8kit_torch {

void register_ops(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_OPS_H_
