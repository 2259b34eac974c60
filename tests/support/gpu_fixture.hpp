// A GPU test's runtime: device 0, its own cache directory, its context current
// (DeviceBuffer allocates in it).
#pragma once
#include <string>

#include "runtime/runtime.hpp"
#include "tests/support/temp_dir.hpp"

namespace kdtree::test {

struct Gpu {
  TempDir dir;
  Engine rt;
  // `name` prefixes the cache directory: /tmp/<name>-XXXXXX.
  explicit Gpu(const std::string& name) : dir(name), rt(0, dir.path) { rt.make_current(); }
};

}  // namespace kdtree::test
