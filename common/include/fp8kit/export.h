/* Symbol visibility for the fp8kit C API. The core is built as one shared
 * library, libfp8kit.so, with -fvisibility=hidden: these symbols are the
 * whole of what it exports (common/libfp8kit.lds keeps it so for code it
 * links in statically, such as the CUDA runtime). */
#ifndef FP8KIT_EXPORT_H_
#define FP8KIT_EXPORT_H_

#if defined(_WIN32)
#define FP8KIT_API
#else
#define FP8KIT_API __attribute__((visibility("default")))
#endif

#endif  /* FP8KIT_EXPORT_H_ */
