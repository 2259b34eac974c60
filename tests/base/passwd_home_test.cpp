// passwd_home (getpwuid_r) agrees with the passwd database as getent(1) reads
// it, whatever the first buffer size, and says "no such user" without an error.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "base/passwd_home.hpp"
#include "cache/disk_cache.hpp"
#include "tests/cache/cache_test_util.hpp"

namespace {

// Field 6 (the home) of `getent passwd <uid>`; nullopt-like "" + found=false when there is no entry.
std::string getent_home(uid_t uid, bool* found) {
  std::FILE* pipe = ::popen(("getent passwd " + std::to_string(uid) + " 2>/dev/null").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string line;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) line.append(buf, n);
  ::pclose(pipe);
  *found = !line.empty();
  std::size_t at = 0;
  for (int field = 0; field < 5 && at != std::string::npos; ++field) at = line.find(':', at) + 1;
  if (!*found || at == 0) return "";
  return line.substr(at, line.find(':', at) - at);
}

}  // namespace

TEST_CASE("passwd_home: this user's home, with any first buffer size[sysconf, 1 byte, 64 bytes]") {
  bool found = false;
  const std::string expected = getent_home(::getuid(), &found);
  if (!found) {
    MESSAGE("uid ", ::getuid(), " has no passwd entry (getent): skipped");
    return;
  }
  for (const std::size_t first : {std::size_t(0), std::size_t(1), std::size_t(64)}) {
    INFO("first buffer: ", first);
    std::string error = "unset";
    CHECK(kdtree::passwd_home(::getuid(), &error, first) == expected);
    CHECK(error.empty());
  }
}

TEST_CASE("passwd_home: a uid without an entry is no home and no error[uid 54321]") {
  bool found = false;
  getent_home(54321, &found);
  if (found) {
    MESSAGE("uid 54321 has a passwd entry here: skipped");
    return;
  }
  std::string error = "unset";
  CHECK(kdtree::passwd_home(54321, &error).empty());
  CHECK(error.empty());
}

TEST_CASE("disk cache: default_dir without HOME is the passwd home's .cache/kdtree") {
  using kdtree::cache::test::EnvVar;
  const std::string home = kdtree::passwd_home(::getuid());
  EnvVar a("KDTREE_CACHE_DIR", std::nullopt);
  EnvVar b("XDG_CACHE_HOME", std::nullopt);
  EnvVar c("HOME", std::nullopt);
  if (home.empty()) {
    CHECK(kdtree::cache::DiskCache::default_dir().empty());
  } else {
    CHECK(kdtree::cache::DiskCache::default_dir() == std::filesystem::path(home) / ".cache" / "kdtree");
  }
}
