// A user's home directory from the passwd database, looked up thread-safely.
#pragma once
#include <pwd.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <string>
#include <vector>

#include "base/posix_io.hpp"

namespace kdtree {

// The home directory (pw_dir) of `uid`, through getpwuid_r (getpwuid's static
// result would race with other threads' lookups). "" when the user has no
// passwd entry or an empty home; then *error (when given) is "" for "no such
// user" and says why for a failed lookup (e.g. "Too many open files").
// initial_buffer: the first buffer size in bytes; 0 = sysconf(_SC_GETPW_R_SIZE_MAX),
// 16 KiB when that is indeterminate. The buffer doubles on ERANGE up to 1 MiB.
inline std::string passwd_home(uid_t uid, std::string* error = nullptr, std::size_t initial_buffer = 0) {
  constexpr std::size_t kFallback = std::size_t(16) << 10, kMax = std::size_t(1) << 20;
  if (error) error->clear();
  std::size_t size = initial_buffer;
  if (size == 0) {
    const long hint = ::sysconf(_SC_GETPW_R_SIZE_MAX);
    size = hint > 0 ? std::size_t(hint) : kFallback;
  }
  std::vector<char> buffer(size);
  for (;;) {
    passwd pw{};
    passwd* found = nullptr;
    const int err = ::getpwuid_r(uid, &pw, buffer.data(), buffer.size(), &found);
    if (err == 0) return found && found->pw_dir ? found->pw_dir : "";
    if (err == EINTR) continue;
    if (err == ERANGE && buffer.size() < kMax) {
      buffer.resize(std::min(buffer.size() * 2, kMax));
      continue;
    }
    // POSIX lets these mean "not found" (getpwuid_r(3)).
    if (err == ENOENT || err == ESRCH || err == EBADF || err == EPERM) return "";
    if (error) *error = err == ERANGE ? "its entry is over 1 MiB" : errno_text(err);
    return "";
  }
}

}  // namespace kdtree
