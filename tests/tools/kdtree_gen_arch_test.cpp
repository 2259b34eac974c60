// kdtree-gen inherits the library's arch check: an unknown --arch is refused
// with the supported list before anything is generated or compiled.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/kdtree_gen_run.hpp"
#include "tests/support/temp_dir.hpp"

TEST_CASE("kdtree-gen: emit and warm refuse an unknown --arch with the supported list") {
  kdtree::test::TempDir tmp("kdtree-gen-arch");
  const std::string cache = tmp.path + "/cache";
  const std::vector<std::string> cases{"emit --op tree_accept --width 16 --arch sm_999",
                                       "emit --op verify_attention --head mla576/512 --arch 1000",
                                       "warm --arch sm_999 --cache-dir '" + cache + "'"};
  for (const std::string& args : cases) {
    INFO("kdtree-gen " << args);
    const kdtree::test::ToolRun r = kdtree::test::run_kdtree_gen(tmp.path, args);
    const std::string out = r.out + r.err;
    CHECK(r.status != 0);
    INFO(out);
    CHECK(out.find("is not supported") != std::string::npos);
    CHECK(out.find("sm_80, sm_86") != std::string::npos);
    CHECK(out.find("extern \"C\"") == std::string::npos);  // nothing was emitted
  }
}
