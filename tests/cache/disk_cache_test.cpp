#include "cache/disk_cache.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "base/error.hpp"
#include "cache_test_util.hpp"

namespace fs = std::filesystem;
using kdtree::cache::DiskCache;
using kdtree::cache::EntryInfo;
using kdtree::cache::Outcome;

using namespace kdtree::cache::test;

TEST_CASE("disk cache: miss builds - then memory hit - a new cache on the dir gets a disk hit") {
  TempDir tmp;
  Builder b{"cubin bytes \x01\x02"};
  Outcome how{};
  {
    DiskCache cache(tmp.path);
    CHECK_FALSE(cache.memory_only());
    CHECK(cache.get_or_build("op_w64", "key material", b.fn(), &how) == bytes(b.payload));
    CHECK(how == Outcome::built);
    CHECK(cache.get_or_build("op_w64", "key material", b.fn(), &how) == bytes(b.payload));
    CHECK(how == Outcome::memory_hit);
    CHECK(b.calls == 1);
  }
  const auto files = entries(tmp.path);
  REQUIRE(files.size() == 1);
  const std::string hash16 = DiskCache::sha256_hex("key material").substr(0, 16);
  CHECK(files[0].filename() == "op_w64-" + hash16 + ".kdc");
  CHECK(file_count(tmp.path) == 1);  // no lock or temp file left behind

  DiskCache again(tmp.path);
  CHECK(again.get_or_build("op_w64", "key material", b.fn(), &how) == bytes(b.payload));
  CHECK(how == Outcome::disk_hit);
  CHECK(again.get_or_build("op_w64", "key material", b.fn(), &how) == bytes(b.payload));
  CHECK(how == Outcome::memory_hit);
  CHECK(b.calls == 1);

  // An empty payload round-trips too.
  Builder empty{""};
  CHECK(again.get_or_build("empty", "nothing", empty.fn(), &how).empty());
  CHECK(DiskCache(tmp.path).get_or_build("empty", "nothing", empty.fn(), &how).empty());
  CHECK(how == Outcome::disk_hit);
  CHECK(empty.calls == 1);
}

TEST_CASE("disk cache: different key material gives different entries") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  Builder a{"payload A"}, b{"payload B"};
  CHECK(cache.get_or_build("op", "source A", a.fn()) == bytes("payload A"));
  CHECK(cache.get_or_build("op", "source B", b.fn()) == bytes("payload B"));
  CHECK(entries(tmp.path).size() == 2);
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);

  Outcome how{};
  DiskCache fresh(tmp.path);
  CHECK(fresh.get_or_build("op", "source A", a.fn(), &how) == bytes("payload A"));
  CHECK(how == Outcome::disk_hit);
  CHECK(fresh.get_or_build("op", "source B", b.fn(), &how) == bytes("payload B"));
  CHECK(how == Outcome::disk_hit);
  CHECK(DiskCache::sha256_hex("source A") != DiskCache::sha256_hex("source B"));
}

TEST_CASE("disk cache: a corrupt entry is never returned - it is rebuilt and replaced") {
  // magic 4, format 4, payload size 8, tag size 4, checksum 32, key sha 32; then the (here empty) tag
  constexpr std::size_t kHeader = 84;
  struct Corruption {
    const char* name;
    const char* problem;  // expected in list()'s problem
    std::function<std::string(std::string)> apply;
  };
  const Corruption corruptions[] = {
      {"flipped payload byte", "checksum", [](std::string s) { return flip(s, kHeader + 3, 0x40); }},
      {"truncated payload", "truncated", [](std::string s) { return s.substr(0, s.size() - 5); }},
      {"truncated header", "truncated header", [](std::string s) { return s.substr(0, 40); }},
      {"empty file", "truncated header", [](std::string) { return std::string(); }},
      {"bad magic", "magic", [](std::string s) { return flip(s, 0, 'K' ^ 'X'); }},
      {"bad version", "version", [](std::string s) { return flip(s, 4, 8); }},
      {"trailing bytes", "payload size", [](std::string s) { return s + "junk"; }},
      {"flipped checksum byte", "checksum", [](std::string s) { return flip(s, 20, 1); }},
      {"flipped payload size byte", "payload size", [](std::string s) { return flip(s, 8, 1); }},
      {"wrong key (in the file name's prefix)", "key", [](std::string s) { return flip(s, 55, 1); }},
      // Issue 8 defect 10: list()/verify() compared only the 8 key bytes in the file
      // name; a corrupt key byte past them passed as valid. The checksum covers the key.
      {"wrong key (past the prefix, byte 70)", "checksum", [](std::string s) { return flip(s, 70, 1); }},
      {"wrong key (last key byte, 83)", "checksum", [](std::string s) { return flip(s, 83, 0x80); }},
  };
  for (const auto& c : corruptions) {
    INFO("corruption[" << c.name << "]");
    TempDir tmp;
    Builder b{"the genuine payload, long enough to corrupt"};
    DiskCache(tmp.path).get_or_build("op", "key", b.fn());
    auto files = entries(tmp.path);
    REQUIRE(files.size() == 1);
    const fs::path entry = files[0];
    write_file(entry, c.apply(read_file(entry)));

    auto listed = DiskCache(tmp.path).list();
    REQUIRE(listed.size() == 1);
    CHECK_FALSE(listed[0].valid);
    CHECK(listed[0].problem.find(c.problem) != std::string::npos);

    Outcome how{};
    DiskCache cache(tmp.path);
    CHECK(cache.get_or_build("op", "key", b.fn(), &how) == bytes(b.payload));
    CHECK(how == Outcome::built);
    CHECK(b.calls == 2);
    listed = cache.list();
    REQUIRE(listed.size() == 1);
    CHECK(listed[0].valid);
    CHECK(listed[0].problem.empty());
    CHECK(DiskCache(tmp.path).get_or_build("op", "key", b.fn(), &how) == bytes(b.payload));
    CHECK(how == Outcome::disk_hit);
  }
}

TEST_CASE("disk cache: another key's entry under this key's file name is rebuilt") {
  {
    TempDir tmp;
    Builder mine{"mine"}, theirs{"theirs"};
    DiskCache(tmp.path).get_or_build("op", "my key", mine.fn());
    DiskCache(tmp.path).get_or_build("op", "their key", theirs.fn());
    const fs::path my_entry = tmp.path / ("op-" + DiskCache::sha256_hex("my key").substr(0, 16) + ".kdc");
    const fs::path their_entry = tmp.path / ("op-" + DiskCache::sha256_hex("their key").substr(0, 16) + ".kdc");
    fs::copy_file(their_entry, my_entry, fs::copy_options::overwrite_existing);
    Outcome how{};
    CHECK(DiskCache(tmp.path).get_or_build("op", "my key", mine.fn(), &how) == bytes("mine"));
    CHECK(how == Outcome::built);
    CHECK(mine.calls == 2);
  }
}

TEST_CASE("disk cache: processes racing on one key compile it once") {
  constexpr int kChildren = 4;
  TempDir work;
  const fs::path dir = work.path / "cache";
  const fs::path counter = work.path / "builds.txt";
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kChildren; ++i) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: wait at the gate so all start together; exit status says how it went.
      ::close(gate[1]);
      char c;
      while (::read(gate[0], &c, 1) < 0 && errno == EINTR) {
      }
      const std::string err_path = (work.path / ("stderr-" + std::to_string(i))).string();
      int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err_fd >= 0) ::dup2(err_fd, 2);
      int status = 0;
      try {
        DiskCache cache(dir);
        const auto payload = cache.get_or_build("race", "one key", [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          const std::string line = std::to_string(::getpid()) + "\n";
          int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
          if (fd < 0 || ::write(fd, line.data(), line.size()) != ssize_t(line.size())) std::_Exit(4);
          ::close(fd);
          return bytes("built by " + line);
        });
        std::ofstream out(work.path / ("result-" + std::to_string(i)), std::ios::binary);
        out.write(payload.data(), std::streamsize(payload.size()));
        out.close();
        status = (out && !payload.empty() && !cache.memory_only()) ? 0 : 3;
      } catch (...) {
        status = 2;
      }
      std::_Exit(status);
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // opens the gate
  for (int i = 0; i < kChildren; ++i) {
    int status = 0;
    REQUIRE(::waitpid(children[std::size_t(i)], &status, 0) == children[std::size_t(i)]);
    INFO("child " << i);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const std::string builds = read_file(counter);
  CHECK(count(builds, "\n") == 1);
  const std::string first = read_file(work.path / "result-0");
  CHECK(first == "built by " + builds);
  for (int i = 0; i < kChildren; ++i) {
    INFO("child " << i);
    CHECK(read_file(work.path / ("result-" + std::to_string(i))) == first);
    // A waiting child says so once, naming the lock.
    const std::string err = read_file(work.path / ("stderr-" + std::to_string(i)));
    CHECK(count(err, "kdtree: waiting for another process to compile race (lock ") <= 1);
    CHECK(count(err, "\n") == count(err, "kdtree: waiting"));
  }
  CHECK(entries(dir).size() == 1);
  CHECK(file_count(dir) == 1);  // no lock or temp file left behind
}

TEST_CASE("disk cache: threads racing on one key build it once") {
  constexpr int kThreads = 8;
  TempDir tmp;
  std::atomic<int> builds{0};
  auto slow_build = [&] {
    ++builds;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return bytes("payload");
  };

  SUBCASE("one cache shared by the threads") {
    DiskCache cache(tmp.path);
    std::vector<Outcome> outcomes(kThreads);
    std::vector<std::vector<char>> results(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back(
          [&, i] { results[std::size_t(i)] = cache.get_or_build("op", "key", slow_build, &outcomes[std::size_t(i)]); });
    }
    for (auto& t : threads) t.join();
    CHECK(builds == 1);
    CHECK(std::count(outcomes.begin(), outcomes.end(), Outcome::built) == 1);
    CHECK(std::count(outcomes.begin(), outcomes.end(), Outcome::memory_hit) == kThreads - 1);
    for (const auto& r : results) CHECK(r == bytes("payload"));
  }

  SUBCASE("a cache per thread (the file lock serialises them)") {
    std::vector<std::vector<char>> results(kThreads);
    std::vector<std::thread> threads;
    StderrCapture err;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        DiskCache cache(tmp.path);
        results[std::size_t(i)] = cache.get_or_build("op", "key", slow_build);
      });
    }
    for (auto& t : threads) t.join();
    CHECK(builds == 1);
    for (const auto& r : results) CHECK(r == bytes("payload"));
    CHECK(count(err.text(), "kdtree: warning") == 0);
  }

  SUBCASE("different keys build concurrently") {
    DiskCache cache(tmp.path);
    std::vector<std::thread> threads;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] { cache.get_or_build("op" + std::to_string(i), std::to_string(i), slow_build); });
    }
    for (auto& t : threads) t.join();
    CHECK(builds == kThreads);
    CHECK(entries(tmp.path).size() == std::size_t(kThreads));
    // Serialised builds would take kThreads * 100 ms.
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(100 * kThreads - 100));
  }
}

TEST_CASE("disk cache: an unusable directory degrades to memory with one warning") {
  TempDir tmp;
  const std::string warning = "kdtree: warning: cache directory ";
  auto check_memory_only = [&](const fs::path& dir) {
    INFO("dir " << dir);
    StderrCapture err;
    DiskCache cache(dir);
    CHECK(cache.memory_only());
    Builder b{"payload"};
    Outcome how{};
    CHECK(cache.get_or_build("op", "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::built);
    CHECK(cache.get_or_build("op", "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::memory_hit);
    CHECK(cache.get_or_build("op2", "key2", b.fn(), &how) == bytes("payload"));
    CHECK(b.calls == 2);
    const std::string text = err.text();
    CHECK(count(text, warning) == 1);
    CHECK(count(text, "\n") == 1);
    CHECK(text.find(warning + dir.string() + " is not writable (") != std::string::npos);
    CHECK(text.find("); caching in memory only") != std::string::npos);
  };

  SUBCASE("parent is a regular file (fails for root too)") {
    write_file(tmp.path / "file", "x");
    check_memory_only(tmp.path / "file" / "cache");
  }
  SUBCASE("the path is a regular file") {
    write_file(tmp.path / "file", "x");
    check_memory_only(tmp.path / "file");
  }
  SUBCASE("under /proc (fails for root too)") { check_memory_only("/proc/kdtree-cache-test"); }
  SUBCASE("an existing directory that takes no files: /proc") { check_memory_only("/proc"); }
  SUBCASE("chmod 0555 (only when not root)") {
    if (::geteuid() == 0) return;
    const fs::path dir = tmp.path / "ro";
    {
      Builder b{"prewarmed"};
      DiskCache(dir).get_or_build("op", "warm key", b.fn());
    }
    fs::permissions(dir, fs::perms(0555));
    check_memory_only(dir);
    // A read-only cache still serves the entries it holds.
    Builder b{"other"};
    Outcome how{};
    StderrCapture err;
    CHECK(DiskCache(dir).get_or_build("op", "warm key", b.fn(), &how) == bytes("prewarmed"));
    CHECK(how == Outcome::disk_hit);
    fs::permissions(dir, fs::perms(0755));
  }
  SUBCASE("empty path (no cache directory could be determined): memory only, one warning") {
    StderrCapture err;
    DiskCache cache("");
    CHECK(cache.memory_only());
    Builder b{"payload"};
    CHECK(cache.get_or_build("op", "key", b.fn()) == bytes("payload"));
    CHECK(cache.list().empty());
    CHECK(cache.clear().empty());
    // Issue 8 defect 14: no home and no variable used to mean memory only without a word.
    const std::string text = err.text();
    CHECK(count(text, "kdtree: warning: no cache directory (") == 1);
    CHECK(count(text, "\n") == 1);
  }
  SUBCASE("publishing fails later: degrade once") {
    const fs::path dir = tmp.path / "cache";
    DiskCache cache(dir);
    REQUIRE_FALSE(cache.memory_only());
    fs::remove_all(dir);
    write_file(dir, "the cache dir became a file");
    StderrCapture err;
    Builder b{"payload"};
    CHECK(cache.get_or_build("op", "key", b.fn()) == bytes("payload"));
    CHECK(cache.get_or_build("op2", "key2", b.fn()) == bytes("payload"));
    CHECK(cache.memory_only());
    CHECK(b.calls == 2);
    CHECK(count(err.text(), warning + dir.string() + " is not writable (") == 1);
  }
  SUBCASE("the directory is removed later: it is made again") {
    const fs::path dir = tmp.path / "cache";
    DiskCache cache(dir);
    fs::remove_all(dir);
    Builder b{"payload"};
    CHECK(cache.get_or_build("op", "key", b.fn()) == bytes("payload"));
    CHECK_FALSE(cache.memory_only());
    CHECK(entries(dir).size() == 1);
  }
}

TEST_CASE("disk cache: default_dir precedence (empty counts as unset)") {
  EnvVar home("HOME", "/home/someone");
  SUBCASE("KDTREE_CACHE_DIR first") {
    EnvVar a("KDTREE_CACHE_DIR", "/explicit/dir");
    EnvVar b("XDG_CACHE_HOME", "/xdg");
    CHECK(DiskCache::default_dir() == fs::path("/explicit/dir"));
  }
  SUBCASE("then XDG_CACHE_HOME/kdtree") {
    EnvVar a("KDTREE_CACHE_DIR", "");
    EnvVar b("XDG_CACHE_HOME", "/xdg");
    CHECK(DiskCache::default_dir() == fs::path("/xdg/kdtree"));
    EnvVar c("KDTREE_CACHE_DIR", std::nullopt);
    CHECK(DiskCache::default_dir() == fs::path("/xdg/kdtree"));
  }
  SUBCASE("then HOME/.cache/kdtree") {
    EnvVar a("KDTREE_CACHE_DIR", std::nullopt);
    EnvVar b("XDG_CACHE_HOME", "");
    CHECK(DiskCache::default_dir() == fs::path("/home/someone/.cache/kdtree"));
    EnvVar c("XDG_CACHE_HOME", std::nullopt);
    CHECK(DiskCache::default_dir() == fs::path("/home/someone/.cache/kdtree"));
  }
}

TEST_CASE("disk cache: list - verify - clear") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  Builder b{"payload"};
  cache.get_or_build("alpha_w16", "k1", b.fn());
  cache.get_or_build("beta-w32", "k2", b.fn());  // a '-' inside the readable name is fine
  cache.get_or_build("gamma", "k3", b.fn());
  const fs::path gamma = tmp.path / ("gamma-" + DiskCache::sha256_hex("k3").substr(0, 16) + ".kdc");
  const std::string text = read_file(gamma);
  write_file(gamma, flip(text, text.size() - 1, 1));
  write_file(tmp.path / "junk.kdc", "not an entry");
  write_file(tmp.path / "unrelated.txt", "left alone");
  write_file(tmp.path / "gamma-0123456789abcdef.kdc.lock", "");
  // A temp file unmodified for over DiskCache::kStaleTempAge is stale; a recent
  // one is not, whatever its pid (issue 15 defect 5: a writer in another PID
  // namespace looks dead).
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) std::_Exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const std::string stale = own_temp_name("alpha_w16-0000000000000000.kdc", ::getpid());
  const std::string live = own_temp_name("alpha_w16-0000000000000000.kdc", dead);
  write_file(tmp.path / stale, "partial");
  write_file(tmp.path / live, "partial");
  set_last_use(tmp.path / stale, 2 * 3600);

  auto listed = cache.list();
  // alpha, beta, gamma, junk and the stale temp file (issue 8 defect 8: it was invisible)
  REQUIRE(listed.size() == 5);
  auto find = [&](const std::string& readable) -> const EntryInfo& {
    for (const EntryInfo& e : listed) {
      if (e.readable == readable) return e;
    }
    FAIL("no entry " << readable);
    return listed.front();
  };
  CHECK(std::is_sorted(listed.begin(), listed.end(),
                       [](const EntryInfo& a, const EntryInfo& b) { return a.path < b.path; }));
  CHECK(find("alpha_w16").valid);
  CHECK(find("alpha_w16").bytes == 84 + 7);
  CHECK(find("beta-w32").valid);
  CHECK_FALSE(find("gamma").valid);
  CHECK(find("gamma").problem == "checksum mismatch");
  CHECK_FALSE(find("junk").valid);
  CHECK_FALSE(find("junk").problem.empty());
  CHECK_FALSE(find(stale).valid);
  CHECK(find(stale).kind == EntryInfo::Kind::temp);
  CHECK(find(stale).problem.find("stale temporary file") != std::string::npos);
  CHECK(entries(tmp.path).size() == 4);  // list() changes nothing
  CHECK(fs::exists(tmp.path / stale));

  const auto verified = cache.verify();
  CHECK(verified.size() == 5);
  CHECK(std::count_if(verified.begin(), verified.end(), [](const EntryInfo& e) { return !e.valid; }) == 3);
  for (const EntryInfo& e : verified) {
    INFO(e.path);
    CHECK(e.removed == !e.valid);
    CHECK(e.remove_error.empty());
  }
  CHECK_FALSE(fs::exists(tmp.path / stale));
  listed = cache.list();
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].valid);
  CHECK(listed[1].valid);

  // 2 entries + 1 unheld lock file.
  const auto cleared = cache.clear();
  CHECK(cleared.size() == 3);
  CHECK(std::all_of(cleared.begin(), cleared.end(), [](const EntryInfo& e) { return e.removed; }));
  CHECK(cache.list().empty());
  CHECK(fs::exists(tmp.path / live));
  CHECK_FALSE(fs::exists(tmp.path / "gamma-0123456789abcdef.kdc.lock"));
  CHECK(fs::exists(tmp.path / "unrelated.txt"));
}

TEST_CASE("disk cache: a held lock is waited for - with one message - then built here") {
  TempDir tmp;
  const std::string readable = "locked_op";
  const fs::path lock_path = tmp.path / (readable + "-" + DiskCache::sha256_hex("key").substr(0, 16) + ".kdc.lock");
  // flock conflicts between separate opens even within one process.
  int held = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);
  auto waiting = [&](const std::string& after) {
    return "kdtree: waiting for another process to compile " + readable + " (lock " + lock_path.string() +
           "); compiling it here after " + after + "\n";
  };
  Builder b{"payload"};

  SUBCASE("timeout 0: built here at once, one message") {
    StderrCapture err;
    DiskCache cache(tmp.path, std::chrono::seconds(0));
    Outcome how{};
    CHECK(cache.get_or_build(readable, "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::built);
    CHECK(b.calls == 1);
    CHECK(err.text() == waiting("0 s"));
    CHECK_FALSE(cache.memory_only());
    ::close(held);
    // Published anyway (atomically): the next process gets a disk hit.
    CHECK(DiskCache(tmp.path).get_or_build(readable, "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::disk_hit);
  }

  SUBCASE("released while waiting") {
    StderrCapture err;
    DiskCache cache(tmp.path, std::chrono::seconds(5));
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::close(held);
    });
    Outcome how{};
    CHECK(cache.get_or_build(readable, "key", b.fn(), &how) == bytes("payload"));
    releaser.join();
    CHECK(how == Outcome::built);
    CHECK(err.text() == waiting("5 s"));
    CHECK(b.calls == 1);
  }
}

TEST_CASE("disk cache: a throwing build propagates and leaves no entry and no stuck lock") {
  TempDir tmp;
  DiskCache cache(tmp.path, std::chrono::seconds(1));
  auto failing = []() -> std::vector<char> { throw std::runtime_error("nvrtc said no"); };
  CHECK_THROWS_WITH_AS(cache.get_or_build("op", "key", failing), "nvrtc said no", std::runtime_error);
  CHECK(file_count(tmp.path) == 0);  // no entry, lock or temp file
  CHECK_FALSE(cache.memory_only());

  Builder b{"payload"};
  Outcome how{};
  CHECK(cache.get_or_build("op", "key", b.fn(), &how) == bytes("payload"));
  CHECK(how == Outcome::built);
  // Another process (here: another cache) is not blocked either.
  CHECK(DiskCache(tmp.path, std::chrono::seconds(0)).get_or_build("op", "key", b.fn(), &how) == bytes("payload"));
  CHECK(how == Outcome::disk_hit);
  CHECK(b.calls == 1);
}

TEST_CASE("disk cache: readable names must be file-name safe") {
  TempDir tmp;
  DiskCache cache(tmp.path);
  Builder b{"payload"};
  const std::string bad_names[] = {"", "a/b", ".hidden", "..", std::string(151, 'x'), std::string("a\0b", 3)};
  for (const std::string& bad : bad_names) {
    INFO("readable[" << bad << "]");
    try {
      cache.get_or_build(bad, "key", b.fn());
      FAIL("expected an error");
    } catch (const kdtree::Error& e) {
      CHECK(e.status() == KDTREE_ERROR_INVALID_ARGUMENT);
    }
  }
  CHECK(b.calls == 0);
}
