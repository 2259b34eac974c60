// Issue 8 defect 15: the cache has a size limit with least-recently-used
// eviction (mtime, refreshed on a disk hit) that never touches an entry whose
// lock another process holds, and prune() drops entries of other versions.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <chrono>

#include "cache/disk_cache.hpp"
#include "cache_test_util.hpp"

using kdtree::cache::DiskCache;
using kdtree::cache::EntryInfo;
using kdtree::cache::Outcome;
using namespace kdtree::cache::test;

namespace {

constexpr std::size_t kPayload = 1000;
constexpr std::uint64_t kEntryBytes = 84 + kPayload;  // header + payload, empty version tag

fs::path entry_path(const fs::path& dir, const std::string& name) {
  return dir / (name + "-" + DiskCache::sha256_hex(name).substr(0, 16) + ".kdc");
}

// Stores `name` (key material = name) through a cache limited to max_bytes.
void store(const fs::path& dir, const std::string& name, std::uint64_t max_bytes, const std::string& version = "") {
  Builder b{std::string(kPayload, name[0])};
  DiskCache(dir, std::chrono::seconds(1), max_bytes).get_or_build(name, name, b.fn(), nullptr, version);
}

// Sets the entry's mtime (its last use) to `ago` seconds before now.
void set_last_use(const fs::path& path, int ago) {
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= ago;
  times[1] = times[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

bool present(const fs::path& dir, const std::string& name) { return fs::exists(entry_path(dir, name)); }

}  // namespace

TEST_CASE("disk cache: LRU eviction down to max_bytes[max=3 entries]") {
  TempDir tmp;
  const std::uint64_t max = 3 * kEntryBytes;
  for (const char* name : {"a_op", "b_op", "c_op"}) store(tmp.path, name, max);
  REQUIRE(entries(tmp.path).size() == 3);  // at the limit, not over it
  set_last_use(entry_path(tmp.path, "a_op"), 300);
  set_last_use(entry_path(tmp.path, "b_op"), 200);
  set_last_use(entry_path(tmp.path, "c_op"), 100);

  // A disk hit makes a_op the most recently used, whatever atime does.
  Builder unused{"unused"};
  Outcome how{};
  DiskCache(tmp.path, std::chrono::seconds(1), max).get_or_build("a_op", "a_op", unused.fn(), &how);
  CHECK(how == Outcome::disk_hit);
  CHECK(unused.calls == 0);

  store(tmp.path, "d_op", max);
  CHECK(present(tmp.path, "a_op"));
  CHECK_FALSE(present(tmp.path, "b_op"));  // least recently used
  CHECK(present(tmp.path, "c_op"));
  CHECK(present(tmp.path, "d_op"));

  SUBCASE("an entry whose lock another process holds is never evicted") {
    set_last_use(entry_path(tmp.path, "c_op"), 1000);  // the oldest
    LockHolder holder(entry_path(tmp.path, "c_op").string() + ".lock");
    store(tmp.path, "e_op", max);
    CHECK(present(tmp.path, "c_op"));
    CHECK_FALSE(present(tmp.path, "a_op"));  // the oldest unlocked one went instead
    CHECK(present(tmp.path, "d_op"));
    CHECK(present(tmp.path, "e_op"));
  }
  SUBCASE("a limit below one entry keeps just the new entry") {
    store(tmp.path, "e_op", 1);
    CHECK(entries(tmp.path) == std::vector<fs::path>{entry_path(tmp.path, "e_op")});
    CHECK(file_count(tmp.path) == 1);  // and no lock files left behind
  }
  SUBCASE("0 = unlimited") {
    store(tmp.path, "e_op", 0);
    store(tmp.path, "f_op", 0);
    CHECK(entries(tmp.path).size() == 5);
  }
  SUBCASE("the limit from KDTREE_CACHE_MAX_BYTES") {
    EnvVar limit("KDTREE_CACHE_MAX_BYTES", std::to_string(2 * kEntryBytes));
    Builder e{std::string(kPayload, 'e')};
    DiskCache cache(tmp.path);
    CHECK(cache.max_bytes() == 2 * kEntryBytes);
    cache.get_or_build("e_op", "e_op", e.fn());
    CHECK(entries(tmp.path).size() == 2);
    CHECK(present(tmp.path, "e_op"));
  }
}

TEST_CASE("disk cache: prune removes entries of other versions and formats[current=generator 2 nvrtc 13.0]") {
  TempDir tmp;
  const std::string current = "generator 2 nvrtc 13.0";
  store(tmp.path, "new_op", 0, current);
  store(tmp.path, "old_op", 0, "generator 1 nvrtc 13.0");
  store(tmp.path, "oldnvrtc_op", 0, "generator 2 nvrtc 12.8");
  store(tmp.path, "busy_op", 0, "generator 1 nvrtc 12.8");
  store(tmp.path, "format1_op", 0, current);
  // An entry of format 1 (before version tags): the format field says so.
  const fs::path format1 = entry_path(tmp.path, "format1_op");
  std::string text = read_file(format1);
  text[4] = 1;
  write_file(format1, text);

  auto listed = DiskCache(tmp.path).list();
  REQUIRE(listed.size() == 5);
  CHECK(listed[3].readable == "old_op");
  CHECK(listed[3].version == "generator 1 nvrtc 13.0");

  LockHolder holder(entry_path(tmp.path, "busy_op").string() + ".lock");
  const auto pruned = DiskCache(tmp.path).prune(current);
  REQUIRE(pruned.size() == 4);  // sorted by path: busy, format1, old, oldnvrtc
  CHECK(pruned[0].readable == "busy_op");
  CHECK_FALSE(pruned[0].removed);
  CHECK(pruned[0].remove_error == "in use (another process holds its lock)");
  for (std::size_t i = 1; i < 4; ++i) {
    INFO(pruned[i].readable);
    CHECK(pruned[i].removed);
  }
  CHECK(present(tmp.path, "new_op"));
  CHECK(present(tmp.path, "busy_op"));
  CHECK(entries(tmp.path).size() == 2);
}

TEST_CASE("disk cache: prune and list read each entry once[3 entries, 1 old]") {
  TempDir tmp;
  const std::string current = "generator 2 nvrtc 13.0";
  store(tmp.path, "a_op", 0, current);
  store(tmp.path, "b_op", 0, current);
  store(tmp.path, "old_op", 0, "generator 1 nvrtc 13.0");
  const std::string a = entry_path(tmp.path, "a_op").filename().string();
  const std::string b = entry_path(tmp.path, "b_op").filename().string();
  const std::string old = entry_path(tmp.path, "old_op").filename().string();
  DiskCache cache(tmp.path);
  OpenCounter opens(tmp.path);
  if (!opens.unavailable().empty()) {
    MESSAGE("cannot count opens (", opens.unavailable(), "): skipped");
    return;
  }

  REQUIRE(cache.list().size() == 3);
  auto counted = opens.take();
  CHECK(counted[a] == 1);
  CHECK(counted[b] == 1);
  CHECK(counted[old] == 1);

  const auto pruned = cache.prune(current);
  REQUIRE(pruned.size() == 1);
  CHECK(pruned[0].removed);
  counted = opens.take();
  CHECK(counted[a] == 1);  // read once: the same read says valid and gives the version
  CHECK(counted[b] == 1);
  CHECK(counted[old] == 1);
  CHECK(entries(tmp.path).size() == 2);
}
