// Readers of plain Python values (recipe fields, checkpoint entries,
// constructor arguments) with the strict types fp8kit accepts everywhere: a
// bool is not an int or a float, a str is not a number. `where` names the
// value in the error ("fp8kit.torch.Linear: recipe.margin").
#ifndef FP8KIT_TORCH_EXT_PY_VALUES_H_
#define FP8KIT_TORCH_EXT_PY_VALUES_H_

#include <string>

#include "torch_includes.h"

namespace fp8kit_torch {

// "'16' (str)": a value and its type, for messages.
std::string value_str(pybind11::handle v);

// An int (not a bool) in [lo, hi].
int read_int(pybind11::handle v, const std::string& where, int lo, int hi);
bool read_bool(pybind11::handle v, const std::string& where);
// A finite float (or int, not a bool) >= 0: an amax epsilon.
double read_epsilon(pybind11::handle v, const std::string& where);
std::string read_str(pybind11::handle v, const std::string& where);
// A torch.Tensor (TypeError naming `where` otherwise).
at::Tensor read_tensor(pybind11::handle v, const std::string& where);
// A torch.device or a device string such as "cuda:0".
at::Device read_device(pybind11::handle v, const std::string& where);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_PY_VALUES_H_
