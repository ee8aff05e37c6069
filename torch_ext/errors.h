// Errors in the PyTorch extension.
//
// Everything here throws c10 exceptions (c10::ValueError, c10::TypeError,
// c10::NotImplementedError, c10::Error). They work both under a pybind11
// call (the translator registered by register_exception_translator turns
// them into ValueError / TypeError / NotImplementedError / RuntimeError
// carrying only the message) and inside the autograd engine's backward
// threads (where PyTorch translates them the same way), and they need no
// GIL to be thrown.
#ifndef FP8KIT_TORCH_EXT_ERRORS_H_
#define FP8KIT_TORCH_EXT_ERRORS_H_

#include "torch_includes.h"

namespace fp8kit_torch {

// Throws the exception that fits a failed C API status, with
// fp8kit_last_error()'s text: INVALID_ARGUMENT -> ValueError, UNSUPPORTED ->
// NotImplementedError, anything else -> RuntimeError.
[[noreturn]] void throw_status(fp8kit_status status);

inline void check_status(fp8kit_status status) {
  if (C10_UNLIKELY(status != FP8KIT_OK)) throw_status(status);
}

// Registers the c10 -> Python exception translation for this module.
void register_exception_translator();

}  // namespace fp8kit_torch

// Argument checks: the message names the function, the argument and the fix.
#define FP8KIT_VALUE_CHECK(cond, ...) TORCH_CHECK_VALUE(cond, __VA_ARGS__)
#define FP8KIT_TYPE_CHECK(cond, ...) TORCH_CHECK_TYPE(cond, __VA_ARGS__)

#endif  // FP8KIT_TORCH_EXT_ERRORS_H_
