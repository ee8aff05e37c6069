/* fp8kit status codes, the thread-local error message and the version query.
 *
 * Every fp8kit_* function returns an fp8kit_status. On anything but
 * FP8KIT_OK, fp8kit_last_error() returns a message for the calling thread
 * that says what was wrong and how to fix it. The message stays valid until
 * the next fp8kit call on the same thread. */
#ifndef FP8KIT_STATUS_H_
#define FP8KIT_STATUS_H_

#include "fp8kit/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fp8kit_status {
  FP8KIT_OK = 0,
  FP8KIT_INVALID_ARGUMENT = 1, /* bad dtype, shape, layout, alignment, null pointer */
  FP8KIT_UNSUPPORTED = 2,      /* valid request this build or device cannot run */
  FP8KIT_CUDA_ERROR = 3,       /* a CUDA runtime call failed */
  FP8KIT_CUBLAS_ERROR = 4,     /* a cuBLASLt call failed */
  FP8KIT_INTERNAL = 5          /* a bug in fp8kit: please report it */
} fp8kit_status;

/* Message of the last failed call on this thread ("" when none). */
FP8KIT_API const char* fp8kit_last_error(void);

/* Name of a status code, e.g. "FP8KIT_INVALID_ARGUMENT". */
FP8KIT_API const char* fp8kit_status_name(fp8kit_status status);

/* Library version as "MAJOR.MINOR.PATCH". */
FP8KIT_API const char* fp8kit_version(void);

/* 1 when this build contains the CUDA kernels, 0 for a CPU-only build. */
FP8KIT_API int fp8kit_built_with_cuda(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_STATUS_H_ */
