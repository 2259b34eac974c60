// A fresh directory under /tmp from mkdtemp, removed with everything in it:
// each test's runtime gets its own cache directory.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include <doctest/doctest.h>

namespace kdtree::test {

struct TempDir {
  std::string path;
  // `name` prefixes the directory: /tmp/<name>-XXXXXX.
  explicit TempDir(const std::string& name) {
    std::string tmpl = "/tmp/" + name + "-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace kdtree::test
