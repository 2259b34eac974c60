// Issue 8: what sits at an entry path is not always a regular file of sane
// size, and a lock holder may be alive but stuck. None of it may hang, crash,
// disable the cache or be misreported.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <thread>

#include "base/error.hpp"
#include "cache/disk_cache.hpp"
#include "cache_test_util.hpp"

using kdtree::cache::DiskCache;
using kdtree::cache::EntryInfo;
using kdtree::cache::Outcome;
using namespace kdtree::cache::test;
using Clock = std::chrono::steady_clock;

namespace {

// Unblocks anyone stuck opening the FIFO for reading if the code under test
// still does that (after `after`), so a regression fails instead of hanging.
class FifoWatchdog {
 public:
  FifoWatchdog(fs::path fifo, std::chrono::milliseconds after)
      : thread_([this, fifo, after] {
          const auto deadline = Clock::now() + after;
          while (!done_) {
            if (Clock::now() >= deadline) {
              int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO while nobody reads
              if (fd >= 0) {
                fired_ = true;
                ::close(fd);
              }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  ~FifoWatchdog() {
    done_ = true;
    thread_.join();
  }
  bool fired() const { return fired_; }

 private:
  std::atomic<bool> done_{false}, fired_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("disk cache: a live lock holder stalls others at most lock_timeout[KDTREE_CACHE_LOCK_TIMEOUT=0.2]") {
  TempDir tmp;
  const fs::path entry = entry_path(tmp.path, "stuck_op", "key");
  LockHolder holder(entry.string() + ".lock");  // another process, alive, never releasing
  EnvVar timeout("KDTREE_CACHE_LOCK_TIMEOUT", "0.2");
  Builder b{"payload"};
  StderrCapture err;
  DiskCache cache(tmp.path);
  CHECK(cache.lock_timeout() == std::chrono::milliseconds(200));
  const auto start = Clock::now();
  Outcome how{};
  CHECK(cache.get_or_build("stuck_op", "key", b.fn(), &how) == bytes("payload"));
  const auto waited = Clock::now() - start;
  CHECK(how == Outcome::built);
  CHECK(b.calls == 1);
  CHECK(waited >= std::chrono::milliseconds(200));
  CHECK(waited < std::chrono::seconds(3));
  CHECK_FALSE(cache.memory_only());
  const std::string text = err.text();
  CHECK(count(text, "\n") == 1);
  CHECK(text.find("kdtree: waiting for another process to compile stuck_op (lock " + entry.string() +
                  ".lock); compiling it here after 0.2 s") == 0);
  CHECK(fs::is_regular_file(entry));  // published atomically even without the lock
}

TEST_CASE("disk cache: KDTREE_CACHE_LOCK_TIMEOUT and KDTREE_CACHE_MAX_BYTES parsing") {
  SUBCASE("unset and empty: defaults") {
    EnvVar a("KDTREE_CACHE_LOCK_TIMEOUT", std::nullopt);
    EnvVar b("KDTREE_CACHE_MAX_BYTES", "");
    CHECK(DiskCache::lock_timeout_from_env() == DiskCache::kDefaultLockTimeout);
    CHECK(DiskCache::kDefaultLockTimeout < std::chrono::seconds(600));
    CHECK(DiskCache::max_bytes_from_env() == DiskCache::kDefaultMaxBytes);
  }
  SUBCASE("valid values") {
    const std::pair<const char*, long long> timeouts[] = {{"0", 0}, {"0.25", 250}, {"30", 30000}, {"86400", 86400000}};
    for (const auto& [text, ms] : timeouts) {
      INFO("KDTREE_CACHE_LOCK_TIMEOUT=" << text);
      EnvVar a("KDTREE_CACHE_LOCK_TIMEOUT", text);
      CHECK(DiskCache::lock_timeout_from_env().count() == ms);
    }
    const std::pair<const char*, std::uint64_t> sizes[] = {{"0", 0},        {"4096", 4096},     {"64K", 64 << 10},
                                                           {"3m", 3 << 20}, {"2G", 2ull << 30}, {"1T", 1ull << 40}};
    for (const auto& [text, value] : sizes) {
      INFO("KDTREE_CACHE_MAX_BYTES=" << text);
      EnvVar a("KDTREE_CACHE_MAX_BYTES", text);
      CHECK(DiskCache::max_bytes_from_env() == value);
    }
  }
  SUBCASE("invalid values are an error naming the variable") {
    // Decimal only (issue 15): strtod would take hex, exponents and more.
    for (const char* text : {"-1", "abc", "1s", "nan", "inf", "86401", " 5", "0x10", "1e3", "1.2.3", ".", "+5"}) {
      INFO("KDTREE_CACHE_LOCK_TIMEOUT=" << text);
      EnvVar a("KDTREE_CACHE_LOCK_TIMEOUT", text);
      try {
        DiskCache::lock_timeout_from_env();
        FAIL("accepted");
      } catch (const kdtree::Error& e) {
        CHECK(e.status() == KDTREE_ERROR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find(std::string("KDTREE_CACHE_LOCK_TIMEOUT='") + text + "'") == 0);
      }
    }
    for (const char* text : {"-1", "2GB", "1.5G", "G", "99999999999999999999", "17179869184T", "2 G"}) {
      INFO("KDTREE_CACHE_MAX_BYTES=" << text);
      EnvVar a("KDTREE_CACHE_MAX_BYTES", text);
      try {
        DiskCache::max_bytes_from_env();
        FAIL("accepted");
      } catch (const kdtree::Error& e) {
        CHECK(e.status() == KDTREE_ERROR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find(std::string("KDTREE_CACHE_MAX_BYTES='") + text + "'") == 0);
      }
    }
  }
}

TEST_CASE("disk cache: a FIFO at an entry path never blocks[list,verify,get_or_build]") {
  TempDir tmp;
  const fs::path fifo = entry_path(tmp.path, "fifo_op", "key");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  FifoWatchdog watchdog(fifo, std::chrono::seconds(3));
  const auto start = Clock::now();

  auto listed = DiskCache(tmp.path).list();
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(listed[0].problem == "a FIFO, not a regular file");
  CHECK(listed[0].bytes == 0);

  Builder b{"payload"};
  Outcome how{};
  DiskCache cache(tmp.path);
  CHECK(cache.get_or_build("fifo_op", "key", b.fn(), &how) == bytes("payload"));
  CHECK(how == Outcome::built);
  CHECK(fs::is_regular_file(fs::symlink_status(fifo)));  // replaced by the real entry
  CHECK(DiskCache(tmp.path).list().at(0).valid);

  REQUIRE(fs::remove(fifo));
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  auto verified = DiskCache(tmp.path).verify();
  REQUIRE(verified.size() == 1);
  CHECK(verified[0].removed);
  CHECK_FALSE(fs::exists(fs::symlink_status(fifo)));

  CHECK_FALSE(watchdog.fired());
  CHECK(Clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("disk cache: an entry over kMaxEntryBytes is corrupt and rebuilt[sparse 64 GiB]") {
  TempDir tmp;
  Builder b{"payload"};
  const fs::path entry = entry_path(tmp.path, "huge_op", "key");
  {
    const int fd = ::open(entry.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    const bool sized = ::ftruncate(fd, off_t(64) << 30) == 0;  // sparse: no disk space used
    ::close(fd);
    REQUIRE(sized);
  }
  auto listed = DiskCache(tmp.path).list();
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(listed[0].problem.find("too large (68719476736 bytes") == 0);

  Outcome how{};
  CHECK(DiskCache(tmp.path).get_or_build("huge_op", "key", b.fn(), &how) == bytes("payload"));
  CHECK(how == Outcome::built);
  CHECK(fs::file_size(entry) < 1024);
  CHECK(DiskCache(tmp.path).get_or_build("huge_op", "key", b.fn(), &how) == bytes("payload"));
  CHECK(how == Outcome::disk_hit);
  CHECK(b.calls == 1);
}

TEST_CASE("disk cache: a directory at an entry path affects that key only[empty dir, dir with a file]") {
  TempDir tmp;
  const fs::path entry = entry_path(tmp.path, "dir_op", "key");
  Builder b{"payload"}, other{"other"};
  Outcome how{};

  SUBCASE("empty directory: replaced") {
    fs::create_directory(entry);
    StderrCapture err;
    DiskCache cache(tmp.path);
    CHECK(cache.get_or_build("dir_op", "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::built);
    CHECK(fs::is_regular_file(entry));
    CHECK(err.text().empty());
  }
  SUBCASE("directory with a file: one warning naming the entry, the cache stays on disk") {
    fs::create_directory(entry);
    write_file(entry / "someone's file", "x");
    StderrCapture err;
    DiskCache cache(tmp.path);
    CHECK(cache.get_or_build("dir_op", "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::built);
    CHECK(cache.get_or_build("dir_op", "key", b.fn(), &how) == bytes("payload"));
    CHECK(how == Outcome::memory_hit);
    CHECK_FALSE(cache.memory_only());
    CHECK(cache.get_or_build("other_op", "other key", other.fn()) == bytes("other"));
    CHECK(fs::is_regular_file(entry_path(tmp.path, "other_op", "other key")));
    const std::string text = err.text();
    CHECK(count(text, "\n") == 1);
    CHECK(text == "kdtree: warning: cannot store cache entry " + entry.string() +
                      " (a directory is in the way); this kernel is kept in memory only\n");
    CHECK(text.find("not writable") == std::string::npos);

    auto listed = cache.list();
    REQUIRE(listed.size() == 2);
    CHECK(listed[0].problem == "a directory, not a regular file");
    // verify removes it (and what is in it: the name is the cache's own).
    auto verified = cache.verify();
    REQUIRE(verified.size() == 2);
    CHECK_FALSE(verified[0].valid);
    CHECK(verified[0].removed);
    CHECK_FALSE(fs::exists(entry));
  }
}

TEST_CASE("disk cache: verify and clear report what they could not remove[read-only dir, unprivileged]") {
  TempDir tmp;
  fs::permissions(tmp.path, fs::perms(0755));  // reachable by the unprivileged child
  const fs::path dir = tmp.path / "ro";
  Builder good{"good"}, bad{"bad"};
  DiskCache(dir).get_or_build("good_op", "good key", good.fn());
  DiskCache(dir).get_or_build("bad_op", "bad key", bad.fn());
  const fs::path bad_entry = entry_path(dir, "bad_op", "bad key");
  const std::string text = read_file(bad_entry);
  write_file(bad_entry, flip(text, text.size() - 1, 1));
  fs::create_symlink(tmp.path / "nowhere", entry_path(dir, "link_op", "k"));  // dangling
  fs::permissions(dir, fs::perms(0555));
  const std::string report = run_unprivileged([&] {
    DiskCache cache(dir);  // warns: read-only
    std::string out;
    for (const EntryInfo& e : cache.verify()) {
      out += e.readable + (e.valid ? " valid" : e.removed ? " removed" : " kept: " + e.remove_error) + "\n";
    }
    for (const EntryInfo& e : cache.clear()) {
      out += "clear " + e.readable + (e.removed ? " removed" : " kept: " + e.remove_error) + "\n";
    }
    return out;
  });
  fs::permissions(dir, fs::perms(0755));
  CHECK(report ==
        "bad_op kept: Permission denied\n"
        "good_op valid\n"
        "link_op kept: Permission denied\n"
        "clear bad_op kept: Permission denied\n"
        "clear good_op kept: Permission denied\n"
        "clear link_op kept: Permission denied\n");
  CHECK(fs::exists(bad_entry));

  // With the rights, the dangling link itself (not its target) goes.
  auto verified = DiskCache(dir).verify();
  REQUIRE(verified.size() == 3);
  CHECK(verified[2].problem == "a symbolic link, not a regular file");
  CHECK(verified[2].removed);
  CHECK_FALSE(fs::exists(fs::symlink_status(entry_path(dir, "link_op", "k"))));
}

TEST_CASE("disk cache: clear leaves a lock a live process holds[holder alive, then gone]") {
  TempDir tmp;
  const fs::path entry = entry_path(tmp.path, "busy_op", "key");
  const fs::path lock = entry.string() + ".lock";
  Builder b{"payload"};
  {
    LockHolder holder(lock);
    auto cleared = DiskCache(tmp.path).clear();
    CHECK(cleared.empty());
    CHECK(fs::exists(lock));  // removing it would let a second process build the key at once
  }
  auto cleared = DiskCache(tmp.path).clear();  // the holder is gone: now it is stale
  REQUIRE(cleared.size() == 1);
  CHECK(cleared[0].kind == EntryInfo::Kind::lock);
  CHECK(cleared[0].removed);
  CHECK_FALSE(fs::exists(lock));
}
