// kdtree-gen's subcommands, exit statuses and messages, run as a process.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "cache/disk_cache.hpp"
#include "codegen/verify_attention.hpp"
#include "runtime/runtime.hpp"
#include "tests/cache/cache_test_util.hpp"
#include "tests/support/kdtree_gen_run.hpp"

namespace fs = std::filesystem;
using kdtree::test::kdtree_gen_path;
using kdtree::test::run_kdtree_gen;
using kdtree::test::slurp;
using kdtree::test::ToolRun;

namespace {

// A fresh directory removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("kdtree_gen_test-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Runs a shell command line as is (its own redirections); returns the exit status.
int shell(const std::string& command) {
  const int raw = std::system(command.c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

// The prefix for run_kdtree_gen that runs kdtree-gen as an unprivileged user (uid 65534)
// when we are root, as CI is (without root, permissions apply as they are),
// and opens tmp to that user. `timeout`: a regression that blocks (a FIFO
// opened for reading) fails instead of hanging.
std::string unprivileged(const TempDir& tmp) {
  fs::permissions(tmp.path, fs::perms(0777));
  return std::string("timeout 20 ") + (::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "");
}

}  // namespace

TEST_CASE("kdtree-gen: usage - emit and errors") {
  REQUIRE_MESSAGE(fs::exists(kdtree_gen_path()), "kdtree-gen not found at ", kdtree_gen_path().string(),
                  " (build the kdtree-gen target, or set KDTREE_GEN)");
  TempDir tmp;

  ToolRun r = run_kdtree_gen(tmp.path, "--help");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "warm"));

  r = run_kdtree_gen(tmp.path, "emit --op tree_accept --width 16");
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "extern \"C\""));

  r = run_kdtree_gen(tmp.path,
                     "emit --op verify_attention --head gqa128 --width 32 --page 16 --dtype f16 --arch sm_90 -o '" +
                         (tmp.path / "k.cu").string() + "'");
  CHECK(r.status == 0);
  CHECK(contains(slurp(tmp.path / "k.cu"), "extern \"C\""));

  r = run_kdtree_gen(tmp.path, "emit --head gqa96");
  CHECK(r.status == 2);
  CHECK(contains(r.err, "kdtree-gen: "));
  CHECK(contains(r.err, "gqa96"));

  r = run_kdtree_gen(tmp.path, "warm --widths 48 --cache-dir '" + tmp.path.string() + "'");
  CHECK(r.status == 2);
  CHECK(contains(r.err, "48"));

  r = run_kdtree_gen(tmp.path, "warm --no-such-option");
  CHECK(r.status == 2);
  CHECK(contains(r.err, "kdtree-gen: "));

  r = run_kdtree_gen(tmp.path, "");
  CHECK(r.status == 2);

  r = run_kdtree_gen(tmp.path, "cache list --cache-dir '" + (tmp.path / "missing").string() + "'");
  CHECK(r.status == 0);
  CHECK(!fs::exists(tmp.path / "missing"));
}

TEST_CASE("kdtree-gen: warm - reuse - info and cache list/verify/clear") {
  REQUIRE(fs::exists(kdtree_gen_path()));
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  const std::string dir = " --cache-dir '" + cache.string() + "'";
  const std::string warm =
      "warm --arch sm_90 --heads gqa64 --widths 16 --pages 16 --dtypes bf16 --kv-dtypes as_q --no-tree-ops -j 1" + dir;

  ToolRun r = run_kdtree_gen(tmp.path, warm);
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "compiled verify_attention[gqa64,W=16,page=16,bf16]"));
  CHECK(contains(r.out, "warm: 1 kernels for sm_90: 1 compiled, 0 reused, 0 failed"));

  r = run_kdtree_gen(tmp.path, warm);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "0 compiled, 1 reused, 0 failed"));

  // --json: the summary is one JSON object on stdout, the progress on stderr.
  r = run_kdtree_gen(tmp.path, warm + " --json");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "{\"arch\": \"sm_90\", \"kernels\": 1, \"compiled\": 0, \"reused\": 1, \"failed\": []"));
  CHECK(contains(r.out, "\"stored\": true}"));
  CHECK(contains(r.err, "reused   verify_attention[gqa64,W=16,page=16,bf16]"));
  CHECK(shell("python3 -m json.tool '" + (tmp.path / "stdout").string() + "' >/dev/null") == 0);

  r = run_kdtree_gen(tmp.path, "info" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "NVRTC"));
  CHECK((contains(r.out, "no GPU: ") || contains(r.out, "device 0: ")));
  CHECK(contains(r.out, "entries: 1 "));

  r = run_kdtree_gen(tmp.path, "cache list" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "valid"));

  r = run_kdtree_gen(tmp.path, "cache list --json" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "\"name\": \"verify_attention-"));
  CHECK(contains(r.out, "\"valid\": true"));
  CHECK(contains(r.out, "\"version\": \"generator "));
  CHECK(shell("python3 -m json.tool '" + (tmp.path / "stdout").string() + "' >/dev/null") == 0);
  r = run_kdtree_gen(tmp.path, "info --json" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "\"files\": 1, "));
  CHECK(contains(r.out, "\"max_bytes\": "));
  CHECK(shell("python3 -m json.tool '" + (tmp.path / "stdout").string() + "' >/dev/null") == 0);

  // prune keeps entries of this version.
  r = run_kdtree_gen(tmp.path, "cache prune" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "removed 0 of 0 files"));

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
  r = run_kdtree_gen(tmp.path, "cache verify" + dir);
  CHECK(r.status == 1);
  CHECK(!fs::exists(entry));
  r = run_kdtree_gen(tmp.path, "cache verify" + dir);
  CHECK(r.status == 0);

  r = run_kdtree_gen(tmp.path, warm);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "1 compiled"));
  r = run_kdtree_gen(tmp.path, "cache clear" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "removed "));
  for (const auto& e : fs::directory_iterator(cache)) CHECK(e.path().extension() != ".kdc");
}

TEST_CASE("kdtree-gen: warm fails when a directory blocks an entry[a non-empty directory at the entry path]") {
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  const std::string label = "verify_attention[gqa64,W=16,page=16,bf16]";
  const std::string warm =
      "warm --arch sm_90 --heads gqa64 --widths 16 --pages 16 --dtypes bf16 --kv-dtypes as_q --no-tree-ops -j 1" +
      std::string(" --cache-dir '") + cache.string() + "'";
  ToolRun r = run_kdtree_gen(tmp.path, warm);
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  fs::path entry;
  for (const auto& e : fs::directory_iterator(cache)) {
    if (e.path().extension() == ".kdc") entry = e.path();
  }
  REQUIRE(!entry.empty());
  // Someone's directory, with a file in it, where the entry goes: it cannot be replaced.
  fs::remove(entry);
  fs::create_directory(entry);
  std::ofstream(entry / "someone's file") << "x";

  r = run_kdtree_gen(tmp.path, warm);
  CHECK(r.status == 1);
  const std::string failed = "kdtree-gen: " + label + " failed: ";
  const auto at = r.err.find(failed);
  REQUIRE(at != std::string::npos);
  const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
  CHECK(contains(line, entry.string()));
  CHECK(contains(line, "a directory is in the way"));
  CHECK(contains(r.out, "FAILED   " + label));
  CHECK(contains(r.out, "warm: 1 kernels for sm_90: 0 compiled, 0 reused, 1 failed"));

  r = run_kdtree_gen(tmp.path, warm + " --json");
  CHECK(r.status == 1);
  CHECK(contains(r.out, "\"failed\": [{\"kernel\": \"" + label + "\", \"error\": \""));
  CHECK(contains(r.out, entry.string()));
  CHECK(shell("python3 -m json.tool '" + (tmp.path / "stdout").string() + "' >/dev/null") == 0);
  CHECK(fs::exists(entry / "someone's file"));  // left alone

  fs::remove_all(entry);  // the path was the only problem
  r = run_kdtree_gen(tmp.path, warm);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "1 compiled, 0 reused, 0 failed"));
}

TEST_CASE("kdtree-gen: usage errors name the flag in one format[emit, warm, info, cache]") {
  REQUIRE(fs::exists(kdtree_gen_path()));
  TempDir tmp;
  const std::string missing = (tmp.path / "missing").string();
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"frob", "kdtree-gen: unknown subcommand 'frob' (use warm, emit, info or cache)"},
      {"cache frob", "kdtree-gen: cache: unknown action 'frob' (use list, clear, verify or prune)"},
      // (Last, so that a regression compiles only a small grid.)
      {"warm --arch sm_90 --no-attention --widths 16 --pages 16 -j 1 --heads --cache-dir '" + missing + "'",
       "kdtree-gen: --heads: '--cache-dir' is not a value"},
      {"warm --widths 48", "kdtree-gen: --widths: 48 is not supported (use 16, 32, 64 or 128)"},
      {"warm --jobs 0", "kdtree-gen: --jobs: 0 is not in 1..1024"},
      {"warm --dtypes f32", "kdtree-gen: --dtypes: 'f32' is not supported (use bf16 or f16)"},
      {"warm --kv-dtypes fp8", "kdtree-gen: --kv-dtypes: 'fp8' is not supported (use as_q or e4m3)"},
      {"warm --kv-dtypes as_q,,e4m3", "kdtree-gen: --kv-dtypes: 'as_q,,e4m3' has an empty element"},
      {"warm --kv-dtypes=e4m3,", "kdtree-gen: --kv-dtypes: 'e4m3,' has an empty element"},
      {"emit --kv-dtype fp8", "kdtree-gen: --kv-dtype: 'fp8' is not supported (use as_q or e4m3)"},
      {"emit --op tree_build --kv-dtype e4m3",
       "kdtree-gen: --kv-dtype: not used by --op tree_build (it takes --width)"},
      {"warm --cache-dir ''", "kdtree-gen: --cache-dir: must not be empty"},
      {"info --cache-dir ''", "kdtree-gen: --cache-dir: must not be empty"},
      {"cache list --cache-dir ''", "kdtree-gen: --cache-dir: must not be empty"},
      {"emit --width 48", "kdtree-gen: --width: 48 is not supported (use 16, 32, 64 or 128)"},
      {"emit --width x", "kdtree-gen: --width: 'x' is not an integer"},
      {"emit --page 3", "kdtree-gen: --page: 3 is not supported (use 1, 16, 32, 64 or 128)"},
      {"emit --op frob", "kdtree-gen: --op: 'frob' is not an op"},
      {"emit --op tree_build --head gqa96", "kdtree-gen: --head: head 'gqa96' is not supported"},
      {"emit --op tree_build --head gqa64", "kdtree-gen: --head: not used by --op tree_build (it takes --width)"},
      {"emit --op sample_tokens --width 16", "kdtree-gen: --width: not used by --op sample_tokens (it takes --dtype)"},
      {"emit --op sample_tokens --dtype f16", "kdtree-gen: --dtype: 'f16' is not supported (use bf16 or f32)"},
      {"emit --op verify_attention --dtype f32", "kdtree-gen: --dtype: 'f32' is not supported (use bf16 or f16)"},
      {"emit --arch sm_12", "kdtree-gen: --arch: arch sm_12 is not supported"},
      {"emit -o '" + missing + "/k.cu'",
       "kdtree-gen: --output: cannot open " + missing + "/k.cu: No such file or directory"},
  };
  for (const Case& c : cases) {
    INFO("kdtree-gen " << c.args);
    const ToolRun r = run_kdtree_gen(tmp.path, c.args);
    CHECK(r.status == 2);
    CHECK(r.err.rfind(c.message, 0) == 0);
    CHECK(r.out.empty());
    // No enum integers: the old sample_tokens message said "dtype f16 (1)".
    CHECK_FALSE(contains(r.err, "(1)"));
  }
  CHECK_FALSE(fs::exists(missing));  // --heads did not swallow --cache-dir into a run
}

TEST_CASE("kdtree-gen: --page takes exactly codegen's page sizes[each size and its neighbours]") {
  TempDir tmp;
  const std::string use = "(use " + kdtree::codegen::supported_page_sizes_text() + ")";
  for (const int size : kdtree::codegen::supported_page_sizes()) {
    for (const int page : {size - 1, size, size + 1}) {
      if (page != size && kdtree::codegen::is_supported_page_size(page)) continue;  // another size's turn
      INFO("page ", page);
      const ToolRun r = run_kdtree_gen(tmp.path, "emit --op kv_compact --width 16 --page " + std::to_string(page));
      if (page == size) {
        CHECK(r.status == 0);
        CHECK(contains(r.out, "extern \"C\""));
      } else {
        CHECK(r.status == 2);
        CHECK(contains(r.err, "kdtree-gen: --page: " + std::to_string(page) + " is not supported " + use));
      }
    }
  }
}

TEST_CASE("kdtree-gen: a write error on stdout exits 2[emit > /dev/full, info > /dev/full]") {
  REQUIRE(fs::exists(kdtree_gen_path()));
  TempDir tmp;
  const std::string tool = "'" + kdtree_gen_path().string() + "' ";
  const std::string err = " 2>'" + (tmp.path / "err").string() + "'";
  CHECK(shell(tool + "emit --op tree_accept --width 16 >/dev/full" + err) == 2);
  CHECK(contains(slurp(tmp.path / "err"), "kdtree-gen: cannot write to standard output: No space left on device"));
  CHECK(shell(tool + "info --cache-dir '" + tmp.path.string() + "' >/dev/full" + err) == 2);
  CHECK(contains(slurp(tmp.path / "err"), "kdtree-gen: cannot write to standard output: "));
  CHECK(shell(tool + "emit --op tree_accept --width 16 >/dev/null" + err) == 0);
}

TEST_CASE("kdtree-gen: warm into an unusable cache fails before compiling[a file, /proc, read-only, no home]") {
  REQUIRE(fs::exists(kdtree_gen_path()));
  TempDir tmp;
  const std::string grid = "warm --arch sm_90 --no-attention --widths 16 --pages 16 -j 1";
  {
    std::ofstream(tmp.path / "file") << "x";
    const ToolRun r = run_kdtree_gen(tmp.path, grid + " --cache-dir '" + (tmp.path / "file").string() + "'");
    CHECK(r.status == 2);
    CHECK(r.err.rfind("kdtree-gen: warm: cache directory " + (tmp.path / "file").string() + " is not usable (", 0) ==
          0);
    CHECK_FALSE(contains(r.out, "compiled"));
  }
  {
    const ToolRun r = run_kdtree_gen(tmp.path, grid + " --cache-dir /proc/kdtree-gen-test");
    CHECK(r.status == 2);
    CHECK(contains(r.err, "kdtree-gen: warm: cache directory /proc/kdtree-gen-test is not usable ("));
  }
  {
    const fs::path ro = tmp.path / "ro";
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms(0555));
    const ToolRun r = run_kdtree_gen(tmp.path, grid + " --cache-dir '" + ro.string() + "'", unprivileged(tmp));
    CHECK(r.status == 2);
    CHECK(contains(r.err, "kdtree-gen: warm: cache directory " + ro.string() + " is not usable (Permission denied)"));
  }
  if (::geteuid() == 0) {
    // A user without a passwd entry and no HOME/XDG_CACHE_HOME/KDTREE_CACHE_DIR.
    const ToolRun r = run_kdtree_gen(tmp.path, grid,
                                     "env -u HOME -u XDG_CACHE_HOME -u KDTREE_CACHE_DIR setpriv --reuid=54321 "
                                     "--regid=54321 --clear-groups ");
    CHECK(r.status == 2);
    CHECK(contains(r.err, "kdtree-gen: warm: no cache directory: "));
  } else {
    MESSAGE("not root: the no-home case needs a user without a passwd entry (setpriv); skipped");
  }
}

TEST_CASE("kdtree-gen: odd files in the cache[FIFO entry: no hang; read-only: removal failures reported]") {
  REQUIRE(fs::exists(kdtree_gen_path()));
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  fs::create_directories(cache);
  const std::string dir = " --cache-dir '" + cache.string() + "'";
  const fs::path fifo = cache / "op-0123456789abcdef.kdc";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  // `timeout` turns a regression (a blocking open) into a failure, not a hung suite.
  ToolRun r = run_kdtree_gen(tmp.path, "info" + dir, "timeout 10 ");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "entries: 1 (0 B, 0 bytes), 1 bad"));
  r = run_kdtree_gen(tmp.path, "cache list" + dir, "timeout 10 ");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "bad: a FIFO, not a regular file"));

  // As a user who cannot write the directory, verify and clear say what they could not remove.
  fs::permissions(cache, fs::perms(0555));
  r = run_kdtree_gen(tmp.path, "cache verify" + dir, unprivileged(tmp));
  CHECK(r.status == 1);
  CHECK(contains(r.out, "NOT removed (Permission denied): a FIFO, not a regular file"));
  CHECK(contains(r.out, "1 bad (0 removed, 1 could not be)"));
  r = run_kdtree_gen(tmp.path, "cache clear" + dir, unprivileged(tmp));
  CHECK(r.status == 1);
  CHECK(contains(r.err, "kdtree-gen: cannot remove " + fifo.string() + ": Permission denied"));
  CHECK(contains(r.out, "removed 0 of 1 files"));
  CHECK(fs::exists(fs::symlink_status(fifo)));
  fs::permissions(cache, fs::perms(0755));

  r = run_kdtree_gen(tmp.path, "cache verify" + dir, "timeout 10 ");
  CHECK(r.status == 1);
  CHECK(contains(r.out, "removed: a FIFO, not a regular file"));
  CHECK_FALSE(fs::exists(fs::symlink_status(fifo)));
}

// ------------------------------------------------------------------ issue 15: cache and CLI defects

namespace {

// An entry stored by a cache without the runtime's payload check.
fs::path plant_entry(const fs::path& dir, const std::string& name, const std::string& payload,
                     const std::string& version) {
  kdtree::cache::DiskCache(dir, std::chrono::seconds(1), 0)
      .get_or_build(
          name, name, [&] { return std::vector<char>(payload.begin(), payload.end()); }, nullptr, version);
  return kdtree::cache::test::entry_path(dir, name, name);
}

}  // namespace

// Defect 1: `cache clear` removed any stale-looking name containing ".tmp.", directories recursively.
TEST_CASE("kdtree-gen: cache clear and verify leave foreign *.tmp.* files and directories[work.tmp dir, draft.tmp]") {
  TempDir tmp;
  const fs::path d = tmp.path / "d";
  REQUIRE(shell("mkdir -p '" + d.string() + "/work.tmp.4000000/data' && echo y > '" + d.string() +
                "/draft.tmp.4000001' && touch -h -d '2 hours ago' '" + d.string() + "/work.tmp.4000000' '" +
                d.string() + "/draft.tmp.4000001'") == 0);
  for (const char* action : {"clear", "verify"}) {
    const ToolRun r = run_kdtree_gen(tmp.path, std::string("cache ") + action + " --cache-dir '" + d.string() + "'");
    INFO(action, r.out, r.err);
    CHECK(r.status == 0);
    CHECK(fs::exists(d / "work.tmp.4000000" / "data"));
    CHECK(fs::exists(d / "draft.tmp.4000001"));
  }
}

// Defect 2: an entry with a right checksum and a payload that does not unpack was "valid".
TEST_CASE("kdtree-gen: cache verify reports and removes an entry whose payload does not unpack") {
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  const fs::path entry = plant_entry(cache, "op", "not a KDMD payload", kdtree::cache_version());
  ToolRun r = run_kdtree_gen(tmp.path, "cache list --cache-dir '" + cache.string() + "'");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "bad: payload: no KDMD header"));
  r = run_kdtree_gen(tmp.path, "cache verify --cache-dir '" + cache.string() + "'");
  INFO(r.out, r.err);
  CHECK(r.status == 1);
  CHECK(contains(r.out, "removed: payload: no KDMD header"));
  CHECK_FALSE(fs::exists(entry));
}

// Defect 3: prune said "removed 1 of 1" and exited 0 for an entry it could not remove.
TEST_CASE("kdtree-gen: cache prune exits 1 when an entry cannot be removed[lock held, read-only dir]") {
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  const std::string dir = " --cache-dir '" + cache.string() + "'";
  // An older generator on this NVRTC: prune removes it.
  const std::string unpacks(
      "KDMD\0\0\0\0\x7f"
      "ELF",
      12);  // no log, an ELF "cubin": a valid payload
  const fs::path old = plant_entry(cache, "old_op", unpacks, "generator 0 nvrtc " + kdtree::nvrtc_version());
  {
    kdtree::cache::test::LockHolder holder(old.string() + ".lock");
    const ToolRun r = run_kdtree_gen(tmp.path, "cache prune" + dir);
    INFO(r.out, r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.out, "removed 0 of 1 files"));
    CHECK(contains(r.err, "kdtree-gen: cannot remove " + old.string() + ": in use (another process holds its lock)"));
  }
  fs::permissions(cache, fs::perms(0555));
  ToolRun r = run_kdtree_gen(tmp.path, "cache prune" + dir, unprivileged(tmp));
  fs::permissions(cache, fs::perms(0755));
  CHECK(r.status == 1);
  CHECK(contains(r.out, "removed 0 of 1 files"));
  CHECK(contains(r.err, "Permission denied"));
  r = run_kdtree_gen(tmp.path, "cache prune" + dir);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "removed 1 of 1 files"));
  CHECK_FALSE(fs::exists(old));
  // The policy for other NVRTC versions is in --help.
  r = run_kdtree_gen(tmp.path, "cache prune --help");
  CHECK(contains(r.out, "newest generator's for that NVRTC"));
}

// Defect 4: an unreadable cache directory looked empty (0 files, exit 0).
TEST_CASE("kdtree-gen: an unreadable cache directory is reported and exits 2[mode 0300; parent 0700 as root]") {
  TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  plant_entry(cache, "op", "x", "v");
  fs::permissions(cache, fs::perms(0300));
  const std::string prefix = unprivileged(tmp);
  for (const char* cmd : {"cache list", "cache verify", "cache clear", "cache prune", "info"}) {
    const ToolRun r = run_kdtree_gen(tmp.path, std::string(cmd) + " --cache-dir '" + cache.string() + "'", prefix);
    INFO(cmd, r.out, r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, "kdtree-gen: cannot list the cache directory " + cache.string() + ": Permission denied"));
  }
  fs::permissions(cache, fs::perms(0755));
  if (::geteuid() == 0) {  // a directory under one the user cannot search: stat itself fails
    const fs::path locked = tmp.path / "locked";
    fs::create_directories(locked / "cache");
    fs::permissions(locked, fs::perms(0700));
    const ToolRun r = run_kdtree_gen(tmp.path, "cache list --cache-dir '" + (locked / "cache").string() + "'", prefix);
    CHECK(r.status == 2);
    CHECK(contains(
        r.err, "kdtree-gen: cannot access the cache directory " + (locked / "cache").string() + ": Permission denied"));
  }
  CHECK(fs::exists(kdtree::cache::test::entry_path(cache, "op", "op")));
}

TEST_CASE(
    "kdtree-gen: cache commands and the CLI's odd values[/dev/null, memory-only warning, 0x10, empty list element]") {
  TempDir tmp;
  for (const char* cmd : {"cache list", "cache clear", "info"}) {
    const ToolRun r = run_kdtree_gen(tmp.path, std::string(cmd) + " --cache-dir /dev/null");
    INFO(cmd, r.out, r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, "kdtree-gen: cache directory /dev/null is not a directory"));
  }
  // list/verify/info store nothing: no "caching in memory only" about a read-only directory.
  const fs::path ro = tmp.path / "ro";
  plant_entry(ro, "op", "x", "v");
  fs::permissions(ro, fs::perms(0555));
  for (const char* cmd : {"cache list", "cache verify", "info"}) {
    const ToolRun r =
        run_kdtree_gen(tmp.path, std::string(cmd) + " --cache-dir '" + ro.string() + "'", unprivileged(tmp));
    INFO(cmd, r.out, r.err);
    CHECK_FALSE(contains(r.err, "memory only"));
  }
  fs::permissions(ro, fs::perms(0755));
  {
    const ToolRun r =
        run_kdtree_gen(tmp.path, "info --cache-dir '" + ro.string() + "'", "env KDTREE_CACHE_LOCK_TIMEOUT=0x10 ");
    CHECK(r.status == 2);
    CHECK(contains(r.err, "KDTREE_CACHE_LOCK_TIMEOUT='0x10' is not a number of seconds"));
  }
  const std::pair<const char*, const char*> lists[] = {{"--widths 16,,32", "--widths: '16,,32' has an empty element"},
                                                       {"--widths=16,", "--widths: '16,' has an empty element"},
                                                       {"--pages ,16", "--pages: ',16' has an empty element"},
                                                       {"--heads gqa64,,gqa128", "--heads: 'gqa64,,gqa128'"}};
  for (const auto& [args, message] : lists) {
    const ToolRun r = run_kdtree_gen(
        tmp.path, std::string("warm --arch sm_90 --cache-dir '") + (tmp.path / "w").string() + "' " + args);
    INFO(args, r.err);
    CHECK(r.status == 2);
    CHECK(r.err.rfind(std::string("kdtree-gen: ") + message, 0) == 0);
    CHECK_FALSE(contains(r.out, "compiled"));
  }
}

// Defect 9: kdtree-gen uses the NVRTC the loader finds first (LD_LIBRARY_PATH
// over its RUNPATH), which is how `python -m kdtree` hands it the package's;
// info says which library that is.
TEST_CASE("kdtree-gen: info names the NVRTC library and LD_LIBRARY_PATH chooses it") {
  TempDir tmp;
  ToolRun r = run_kdtree_gen(tmp.path, "info --json --cache-dir '" + (tmp.path / "c").string() + "'");
  REQUIRE(r.status == 0);
  const std::string key = "\"nvrtc_library\": \"";
  const auto at = r.out.find(key);
  REQUIRE(at != std::string::npos);
  const fs::path loaded = r.out.substr(at + key.size(), r.out.find('"', at + key.size()) - at - key.size());
  REQUIRE(fs::exists(loaded));
  const fs::path other = tmp.path / "other-nvrtc";
  fs::create_directories(other);
  fs::create_symlink(fs::canonical(loaded), other / loaded.filename());
  r = run_kdtree_gen(tmp.path, "info --cache-dir '" + (tmp.path / "c").string() + "'",
                     "env LD_LIBRARY_PATH='" + other.string() + "' ");
  INFO(r.out, r.err);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "NVRTC:   " + kdtree::nvrtc_version() + " (" + (other / loaded.filename()).string() + ")"));
}
