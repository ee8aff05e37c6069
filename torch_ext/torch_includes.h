// The heavy third-party headers every torch_ext translation unit needs, in
// one place so that CMake can precompile them (cmake/Torch.cmake) and the
// order of the pybind11 and torch includes is the same everywhere.
#ifndef FP8KIT_TORCH_EXT_TORCH_INCLUDES_H_
#define FP8KIT_TORCH_EXT_TORCH_INCLUDES_H_

#include <Python.h>

#include <pybind11/gil_safe_call_once.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#ifdef FP8KIT_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "fp8kit/fp8kit.h"

#endif  // FP8KIT_TORCH_EXT_TORCH_INCLUDES_H_
