// Issue 8 defect 6: the source of a failed compile went to a predictable /tmp
// name, opened with truncation and following symlinks: anyone could plant a link
// there and have a user's file overwritten.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "base/error.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace kdtree;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Compiles a broken source; returns the "source: <path>" of the error message.
std::string failed_source_path(const codegen::KernelSource& src) {
  try {
    nvrtc_compile(src, codegen::arch_from_sm(120));
  } catch (const Error& e) {
    const std::string msg = e.what();
    const auto at = msg.find("\nsource: ");
    REQUIRE(at != std::string::npos);
    return msg.substr(at + 9, msg.find('\n', at + 9) - at - 9);
  }
  FAIL("expected a compile error");
  return "";
}

}  // namespace

TEST_CASE("a failed compile's source goes to a private new file[planted symlink at the old name]") {
  test::TempDir tmp("kdtree-failed-source-test");
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::optional<std::string> saved = old_tmpdir ? std::optional<std::string>(old_tmpdir) : std::nullopt;
  ::setenv("TMPDIR", tmp.path.c_str(), 1);

  codegen::KernelSource src;
  src.op = "broken";
  src.label = "broken[test]";
  src.file_stem = "broken-test";
  src.source = "extern \"C\" __global__ void k() { this_is_not_declared = 1; }\n";
  const fs::path victim = fs::path(tmp.path) / "victim";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, fs::path(tmp.path) / "kdtree-failed-broken-test-sm_120.cu");  // the old name

  const std::string first = failed_source_path(src);
  const std::string second = failed_source_path(src);
  if (saved)
    ::setenv("TMPDIR", saved->c_str(), 1);
  else
    ::unsetenv("TMPDIR");

  CHECK(slurp(victim) == "precious");
  CHECK(first != second);
  for (const std::string& path : {first, second}) {
    INFO(path);
    CHECK(path.rfind(tmp.path + "/kdtree-failed-broken-test-sm_120-", 0) == 0);
    CHECK(path.size() > 3);
    CHECK(path.compare(path.size() - 3, 3, ".cu") == 0);
    struct stat st {};
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(slurp(path) == src.source);
  }
}
