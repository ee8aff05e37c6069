#include "errors.h"

#include <string>

namespace fp8kit_torch {

void throw_status(fp8kit_status status) {
  std::string msg = std::string("fp8kit: ") + fp8kit_last_error();
  if (msg.size() == 8) msg += fp8kit_status_name(status);  // no message was set
  switch (status) {
    case FP8KIT_INVALID_ARGUMENT:
      C10_THROW_ERROR(ValueError, msg);
    case FP8KIT_UNSUPPORTED:
      C10_THROW_ERROR(NotImplementedError, msg);
    default:
      C10_THROW_ERROR(Error, msg + " (" + fp8kit_status_name(status) + ")");
  }
}

void register_exception_translator() {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    // Most specific first: the c10 error types derive from c10::Error.
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

}  // namespace fp8kit_torch
