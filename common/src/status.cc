// Thread-local error message, status names, version and build queries.
#include "fp8kit/status.h"

#include <string>

#include "error.h"

#ifndef FP8KIT_VERSION_STRING
#define FP8KIT_VERSION_STRING "0.1.0"
#endif

namespace fp8kit {
namespace {
thread_local std::string last_error;
}  // namespace

void set_last_error(const std::string& message) { last_error = message; }

}  // namespace fp8kit

extern "C" {

const char* fp8kit_last_error(void) { return fp8kit::last_error.c_str(); }

const char* fp8kit_status_name(fp8kit_status status) {
  switch (status) {
    case FP8KIT_OK: return "FP8KIT_OK";
    case FP8KIT_INVALID_ARGUMENT: return "FP8KIT_INVALID_ARGUMENT";
    case FP8KIT_UNSUPPORTED: return "FP8KIT_UNSUPPORTED";
    case FP8KIT_CUDA_ERROR: return "FP8KIT_CUDA_ERROR";
    case FP8KIT_CUBLAS_ERROR: return "FP8KIT_CUBLAS_ERROR";
    case FP8KIT_INTERNAL: return "FP8KIT_INTERNAL";
  }
  return "FP8KIT_UNKNOWN_STATUS";
}

const char* fp8kit_version(void) { return FP8KIT_VERSION_STRING; }

int fp8kit_built_with_cuda(void) {
#ifdef FP8KIT_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
