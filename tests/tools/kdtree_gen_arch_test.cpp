// kdtree-gen inherits the library's arch check: an unknown --arch is refused
// with the supported list before anything is generated or compiled.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// Runs the built kdtree-gen (next to this test binary, or $KDTREE_GEN) with
// stderr folded into the captured output.
int run_tool(const std::string& args, std::string* output) {
  const char* env = std::getenv("KDTREE_GEN");
  const fs::path tool = env ? fs::path(env) : fs::read_symlink("/proc/self/exe").parent_path() / "kdtree-gen";
  REQUIRE_MESSAGE(fs::exists(tool), "kdtree-gen not found at " << tool.string());
  FILE* pipe = ::popen(("'" + tool.string() + "' " + args + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output->append(buffer, n);
  const int raw = ::pclose(pipe);
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

}  // namespace

TEST_CASE("kdtree-gen: emit and warm refuse an unknown --arch with the supported list") {
  const std::string cache = (fs::temp_directory_path() / ("kdtree-gen-arch-" + std::to_string(::getpid()))).string();
  const std::vector<std::string> cases{"emit --op tree_accept --width 16 --arch sm_999",
                                       "emit --op verify_attention --head mla576/512 --arch 1000",
                                       "warm --arch sm_999 --cache-dir '" + cache + "'"};
  for (const std::string& args : cases) {
    INFO("kdtree-gen " << args);
    std::string out;
    CHECK(run_tool(args, &out) != 0);
    INFO(out);
    CHECK(out.find("is not supported") != std::string::npos);
    CHECK(out.find("sm_80, sm_86") != std::string::npos);
    CHECK(out.find("extern \"C\"") == std::string::npos);  // nothing was emitted
  }
  std::error_code ec;
  fs::remove_all(cache, ec);
}
