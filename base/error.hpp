// Errors inside kdtree are exceptions carrying a kdtree_status; the C ABI turns
// them into a status plus the thread-local kdtree_last_error() message. It sits
// below codegen, cache and runtime (it needs only kdtree.h and fmt), so every
// layer can throw it without depending on a layer above.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kdtree/kdtree.h"

namespace kdtree {

class Error : public std::runtime_error {
 public:
  Error(kdtree_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  kdtree_status status() const { return status_; }

 private:
  kdtree_status status_;
};

[[noreturn]] inline void fail(kdtree_status status, const std::string& message) { throw Error(status, message); }

// Throws KDTREE_ERROR_INVALID_ARGUMENT naming the argument when `ok` is false.
// The formatted form formats only on failure: these checks sit on the launch path.
inline void require(bool ok, const char* message) {
  if (!ok) fail(KDTREE_ERROR_INVALID_ARGUMENT, message);
}
inline void require(bool ok, const std::string& message) {
  if (!ok) fail(KDTREE_ERROR_INVALID_ARGUMENT, message);
}
template <typename T, typename... Rest>
inline void require(bool ok, fmt::format_string<T, Rest...> format, T&& first, Rest&&... rest) {
  if (!ok)
    fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format(format, std::forward<T>(first), std::forward<Rest>(rest)...));
}

}  // namespace kdtree
