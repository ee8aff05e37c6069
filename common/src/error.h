// Errors inside the core: C++ exceptions that never cross the C API.
//
// Internal code throws fp8kit::Error (via FP8KIT_CHECK / fail()); every
// extern "C" entry point wraps its body in fp8kit::guard(), which catches
// everything, stores the message in the thread-local slot read by
// fp8kit_last_error() and returns the status code.
#ifndef FP8KIT_SRC_ERROR_H_
#define FP8KIT_SRC_ERROR_H_

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "fp8kit/status.h"

namespace fp8kit {

class Error : public std::runtime_error {
 public:
  Error(fp8kit_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  fp8kit_status status() const { return status_; }

 private:
  fp8kit_status status_;
};

// Builds a message from any streamable parts: fail(FP8KIT_INVALID_ARGUMENT,
// "gemm: A is ", m, "x", k, " but ...").
template <typename... Parts>
[[noreturn]] void fail(fp8kit_status status, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(status, os.str());
}

// Stores `message` as this thread's last error.
void set_last_error(const std::string& message);

// Runs `body` (which returns void); maps exceptions to status codes.
template <typename Body>
fp8kit_status guard(Body&& body) noexcept {
  try {
    set_last_error("");
    body();
    return FP8KIT_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return FP8KIT_INTERNAL;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return FP8KIT_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return FP8KIT_INTERNAL;
  }
}

}  // namespace fp8kit

// Throws FP8KIT_INVALID_ARGUMENT with the streamed message unless `cond`.
#define FP8KIT_CHECK(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) ::fp8kit::fail(FP8KIT_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#endif  // FP8KIT_SRC_ERROR_H_
