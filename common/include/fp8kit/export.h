/* Symbol visibility for the fp8kit C API. The core is linked statically
 * into each extension module, which is built with -fvisibility=hidden; the
 * API symbols stay default-visible so a shared build of the core works too. */
#ifndef FP8KIT_EXPORT_H_
#define FP8KIT_EXPORT_H_

#if defined(_WIN32)
#define FP8KIT_API
#else
#define FP8KIT_API __attribute__((visibility("default")))
#endif

#endif  /* FP8KIT_EXPORT_H_ */
