// Errors inside kdtree are exceptions carrying a kdtree_status; the C ABI turns
// them into a status plus the thread-local kdtree_last_error() message.
#pragma once
#include <stdexcept>
#include <string>

#include "kdtree/kdtree.h"

namespace kdtree {

class Error : public std::runtime_error {
 public:
  Error(kdtree_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  kdtree_status status() const { return status_; }

 private:
  kdtree_status status_;
};

[[noreturn]] inline void fail(kdtree_status status, const std::string& message) {
  throw Error(status, message);
}

// Throws KDTREE_ERROR_INVALID_ARGUMENT naming the argument when `ok` is false.
inline void require(bool ok, const std::string& message) {
  if (!ok) fail(KDTREE_ERROR_INVALID_ARGUMENT, message);
}

}  // namespace kdtree
