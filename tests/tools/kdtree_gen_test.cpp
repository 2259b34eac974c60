// Runs the built kdtree-gen (next to this test binary in the build directory).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

fs::path tool_path() {
  if (const char* env = std::getenv("KDTREE_GEN")) return env;
  return fs::read_symlink("/proc/self/exe").parent_path() / "kdtree-gen";
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("kdtree_gen_test-" + std::to_string(getpid()) + "-" +
                                        std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Result {
  int status = -1;
  std::string out, err;
};

Result run(const TempDir& tmp, const std::string& args) {
  const fs::path out = tmp.path / "stdout", err = tmp.path / "stderr";
  const std::string command =
      "'" + tool_path().string() + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int raw = std::system(command.c_str());
  Result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("kdtree-gen: usage - emit and errors") {
  REQUIRE_MESSAGE(fs::exists(tool_path()), "kdtree-gen not found at ", tool_path().string(),
                  " (build the kdtree-gen target, or set KDTREE_GEN)");
  TempDir tmp;

  Result r = run(tmp, "--help");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "warm"));

  r = run(tmp, "emit --op tree_accept --width 16");
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "extern \"C\""));

  r = run(tmp, "emit --op verify_attention --head gqa128 --width 32 --page 16 --dtype f16 --arch sm_90 -o '" +
                   (tmp.path / "k.cu").string() + "'");
  CHECK(r.status == 0);
  CHECK(contains(slurp(tmp.path / "k.cu"), "extern \"C\""));

  r = run(tmp, "emit --head gqa96");
  CHECK(r.status == 2);
  CHECK(contains(r.err, "kdtree-gen: "));
  CHECK(contains(r.err, "gqa96"));

  r = run(tmp, "warm --widths 48 --cache-dir '" + tmp.path.string() + "'");
  CHECK(r.status == 2);
  CHECK(contains(r.err, "48"));

  r = run(tmp, "warm --no-such-option");
  CHECK(r.status == 2);
  CHECK(contains(r.err, "kdtree-gen: "));

  r = run(tmp, "");
  CHECK(r.status == 2);

  r = run(tmp, "cache list --cache-dir '" + (tmp.path / "missing").string() + "'");
  CHECK(r.status == 0);
  CHECK(!fs::exists(tmp.path / "missing"));
}

TEST_CASE("kdtree-gen: warm - reuse - info and cache list/verify/clear") {
  REQUIRE(fs::exists(tool_path()));
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  const std::string dir = " --cache-dir '" + cache.string() + "'";
  const std::string warm =
      "warm --arch sm_90 --heads gqa64 --widths 16 --pages 16 --dtypes bf16 --no-tree-ops -j 1" + dir;

  Result r = run(tmp, warm);
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "compiled verify_attention[gqa64,W=16,page=16,bf16]"));
  CHECK(contains(r.out, "warm: 1 kernels for sm_90: 1 compiled, 0 reused, 0 failed"));

  r = run(tmp, warm);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "0 compiled, 1 reused, 0 failed"));

  r = run(tmp, "info" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "NVRTC"));
  CHECK((contains(r.out, "no GPU: ") || contains(r.out, "device 0: ")));
  CHECK(contains(r.out, "entries: 1 "));

  r = run(tmp, "cache list" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "valid"));

  // Corrupt the entry's last byte: verify reports and removes it, then the cache is clean.
  fs::path entry;
  for (const auto& e : fs::directory_iterator(cache)) {
    if (e.path().extension() == ".kdc") entry = e.path();
  }
  REQUIRE(!entry.empty());
  {
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  r = run(tmp, "cache verify" + dir);
  CHECK(r.status == 1);
  CHECK(!fs::exists(entry));
  r = run(tmp, "cache verify" + dir);
  CHECK(r.status == 0);

  r = run(tmp, warm);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "1 compiled"));
  r = run(tmp, "cache clear" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "removed "));
  for (const auto& e : fs::directory_iterator(cache)) CHECK(e.path().extension() != ".kdc");
}
