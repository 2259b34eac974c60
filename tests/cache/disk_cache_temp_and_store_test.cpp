// Issue 15 defects 1, 2, 4 and 5: which temporary files the cache may remove
// and when, a failed store, a payload the owner rejects, an unreadable directory.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>

#include "base/error.hpp"
#include "cache/disk_cache.hpp"
#include "cache_test_util.hpp"

using kdtree::cache::DiskCache;
using kdtree::cache::EntryInfo;
using kdtree::cache::Outcome;
using namespace kdtree::cache::test;

// Defect 1: anything with ".tmp." in its name was removed once "stale",
// recursively when a directory.
TEST_CASE("disk cache: verify and clear remove only regular files of kdtree's temp-name pattern[foreign, dir, link]") {
  TempDir tmp;
  const std::string entry = entry_path(tmp.path, "op", "key").filename().string();
  const fs::path own = tmp.path / own_temp_name(entry);
  const fs::path foreign_dir = tmp.path / "work.tmp.4000000";
  const fs::path foreign_file = tmp.path / "draft.tmp.4000001";
  const fs::path own_named_dir = tmp.path / own_temp_name(entry, 4000002);
  const fs::path own_named_link = tmp.path / own_temp_name(entry, 4000003);
  const fs::path target = tmp.path / "target";
  auto make = [&] {
    write_file(own, "partial");
    fs::create_directories(foreign_dir / "data");
    write_file(foreign_dir / "data" / "y", "y");
    write_file(foreign_file, "y");
    fs::create_directories(own_named_dir / "data");
    write_file(target, "kept");
    if (!fs::exists(fs::symlink_status(own_named_link))) fs::create_symlink(target, own_named_link);
    for (const fs::path& p : {own, foreign_dir, foreign_file, own_named_dir, own_named_link}) {
      set_last_use(p, 2 * 3600);  // all old enough to be stale
    }
  };
  auto untouched = [&] {
    CHECK(fs::exists(foreign_dir / "data" / "y"));
    CHECK(fs::exists(foreign_file));
    CHECK(fs::exists(own_named_dir / "data"));
    CHECK(fs::is_symlink(own_named_link));
    CHECK(read_file(target) == "kept");
  };
  make();
  const auto listed = DiskCache(tmp.path).list();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].kind == EntryInfo::Kind::temp);
  CHECK(listed[0].path == own);

  const auto verified = DiskCache(tmp.path).verify();
  REQUIRE(verified.size() == 1);
  CHECK(verified[0].removed);
  CHECK_FALSE(fs::exists(own));
  untouched();

  make();
  const auto cleared = DiskCache(tmp.path).clear();
  REQUIRE(cleared.size() == 1);
  CHECK(cleared[0].path == own);
  CHECK(cleared[0].removed);
  CHECK_FALSE(fs::exists(own));
  untouched();
}

// Defect 5: a temp file of a live writer in another PID namespace (its pid is
// not running here) was removed; one of this very pid never was.
TEST_CASE("disk cache: temporary files are stale by age, not by pid[dead pid recent, own pid old]") {
  TempDir tmp;
  const std::string entry = entry_path(tmp.path, "op", "key").filename().string();
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) std::_Exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const fs::path recent = tmp.path / own_temp_name(entry, dead);
  const fs::path old = tmp.path / own_temp_name(entry, ::getpid());
  write_file(recent, "being written elsewhere");
  write_file(old, "abandoned");
  set_last_use(old, int(std::chrono::seconds(DiskCache::kStaleTempAge).count()) + 60);
  const auto cleared = DiskCache(tmp.path).clear();
  REQUIRE(cleared.size() == 1);
  CHECK(cleared[0].path == old);
  CHECK(fs::exists(recent));
  CHECK_FALSE(fs::exists(old));
}

// Defect 5: one failed store (here a write past RLIMIT_FSIZE, as a full disk
// would fail) turned storing off for the rest of the run.
TEST_CASE("disk cache: a failed store fails only that entry[write over RLIMIT_FSIZE]") {
  TempDir tmp;
  DiskCache cache(tmp.path, std::chrono::seconds(1), 0);
  Builder big{std::string(64 * 1024, 'b')}, small{"small"};
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  struct rlimit low = saved;
  low.rlim_cur = 16 * 1024;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
  StderrCapture err;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &low) == 0);
  const std::vector<char> got_big = cache.get_or_build("big_op", "big", big.fn());
  const std::vector<char> got_small = cache.get_or_build("small_op", "small", small.fn());
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  const std::string text = err.text();
  CHECK(got_big == bytes(big.payload));
  CHECK(got_small == bytes("small"));
  CHECK_FALSE(cache.memory_only());
  CHECK_FALSE(fs::exists(entry_path(tmp.path, "big_op", "big")));
  CHECK(fs::is_regular_file(entry_path(tmp.path, "small_op", "small")));
  CHECK(count(text, "kdtree: warning: cannot store cache entry " + entry_path(tmp.path, "big_op", "big").string()) ==
        1);
  CHECK(text.find("not writable") == std::string::npos);
  CHECK(file_count(tmp.path) == 1);  // no temp file left behind
}

// Defect 2: an entry whose checksum is right but whose payload its owner cannot
// unpack was loaded (and failed) every time, and verify called it valid.
TEST_CASE("disk cache: a payload the payload check rejects is a bad entry[rebuilt, listed, removed by verify]") {
  TempDir tmp;
  DiskCache::Options checked;
  checked.payload_check = [](const std::vector<char>& p) {
    return std::string(p.begin(), p.end()).rfind("good", 0) == 0 ? std::string() : std::string("not good");
  };
  Builder bad{"bad payload"}, good{"good payload"};
  DiskCache(tmp.path).get_or_build("op", "key", bad.fn());  // stored by a cache without the check
  DiskCache(tmp.path).get_or_build("other_op", "other", bad.fn());

  const auto listed = DiskCache(tmp.path, checked).list();
  REQUIRE(listed.size() == 2);
  CHECK_FALSE(listed[0].valid);
  CHECK(listed[0].problem == "payload: not good");

  Outcome how{};
  CHECK(DiskCache(tmp.path, checked).get_or_build("op", "key", good.fn(), &how) == bytes("good payload"));
  CHECK(how == Outcome::built);
  CHECK(DiskCache(tmp.path, checked).get_or_build("op", "key", good.fn(), &how) == bytes("good payload"));
  CHECK(how == Outcome::disk_hit);
  CHECK(good.calls == 1);

  const auto verified = DiskCache(tmp.path, checked).verify();
  REQUIRE(verified.size() == 2);
  CHECK(verified[0].valid);  // op, rebuilt
  CHECK_FALSE(verified[1].valid);
  CHECK(verified[1].removed);
  CHECK_FALSE(fs::exists(entry_path(tmp.path, "other_op", "other")));
}

// Defect 4: an unreadable directory listed as empty, so every command said 0 files.
TEST_CASE("disk cache: an unreadable directory is an error, not an empty cache[mode 0300, unprivileged]") {
  TempDir tmp;
  fs::permissions(tmp.path, fs::perms(0755));  // reachable by the unprivileged child
  const fs::path dir = tmp.path / "private";
  Builder b{"payload"};
  DiskCache(dir).get_or_build("op", "key", b.fn());
  fs::permissions(dir, fs::perms(0300));  // no read: cannot be listed (by anyone but root)
  const std::string report = run_unprivileged([&] {
    DiskCache::Options inspect;
    inspect.inspect_only = true;
    DiskCache cache(dir, inspect);
    std::string out;
    const std::pair<const char*, std::function<void()>> calls[] = {{"list", [&] { cache.list(); }},
                                                                   {"verify", [&] { cache.verify(); }},
                                                                   {"clear", [&] { cache.clear(); }},
                                                                   {"prune", [&] { cache.prune("v"); }}};
    for (const auto& [name, call] : calls) {
      try {
        call();
        out += std::string(name) + ": no error\n";
      } catch (const kdtree::Error& e) {
        out += std::string(name) + ": " + e.what() + "\n";
      }
    }
    return out;
  });
  fs::permissions(dir, fs::perms(0755));
  const std::string error = "cannot list the cache directory " + dir.string() + ": Permission denied\n";
  CHECK(report == "list: " + error + "verify: " + error + "clear: " + error + "prune: " + error);
  CHECK(entries(dir).size() == 1);
}
