// Small POSIX helpers that the cache, the compiler and kdtree-gen share.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>
#include <system_error>

namespace kdtree {

// strerror for an errno value, thread-safe.
inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Writes all n bytes to fd, retrying after EINTR and short writes; false on an
// error (errno says which) or a write that makes no progress.
inline bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= std::size_t(w);
  }
  return true;
}

}  // namespace kdtree
