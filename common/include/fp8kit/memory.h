/* Byte copies and fills of a front end's own buffers.
 *
 * The CUDA runtime is linked once per process, into the core (libfp8kit.so);
 * the extension modules link none of their own. A front end that must move
 * or clear a few bytes between kernel calls (an amax carried from one buffer
 * to another, a zeroed accumulator) does it through these functions, on the
 * same runtime and stream as the kernels around it. */
#ifndef FP8KIT_MEMORY_H_
#define FP8KIT_MEMORY_H_

#include <stddef.h>

#include "fp8kit/export.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies `bytes` bytes from `src` to `dst`, both on (device_type,
 * device_index). On the CPU a plain copy; on CUDA an asynchronous
 * device-to-device copy on `stream` (a cudaStream_t, NULL = default
 * stream). The ranges must not overlap. Zero bytes is a no-op. */
FP8KIT_API fp8kit_status fp8kit_copy_bytes(fp8kit_device_type device_type, int device_index,
                                           void* dst, const void* src, size_t bytes,
                                           void* stream);

/* Sets `bytes` bytes at `dst` on (device_type, device_index) to zero; on
 * CUDA asynchronously on `stream`, as fp8kit_copy_bytes. */
FP8KIT_API fp8kit_status fp8kit_zero_bytes(fp8kit_device_type device_type, int device_index,
                                           void* dst, size_t bytes, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_MEMORY_H_ */
