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
  return kdtree::cache::test::entry_path(dir, name, name);
}

// Stores `name` (key material = name) through a cache limited to max_bytes.
void store(const fs::path& dir, const std::string& name, std::uint64_t max_bytes, const std::string& version = "") {
  Builder b{std::string(kPayload, name[0])};
  DiskCache(dir, std::chrono::seconds(1), max_bytes).get_or_build(name, name, b.fn(), nullptr, version);
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

TEST_CASE("disk cache: prune removes entries of older versions and formats[current=generator 2 nvrtc 13.0]") {
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
  // Sorted by path: busy (generator 1 of nvrtc 12.8, where generator 2 is newest),
  // format1, old. oldnvrtc_op is the newest of nvrtc 12.8: another NVRTC's, kept.
  REQUIRE(pruned.size() == 3);
  CHECK(pruned[0].readable == "busy_op");
  CHECK_FALSE(pruned[0].removed);
  CHECK(pruned[0].remove_error == "in use (another process holds its lock)");
  for (std::size_t i = 1; i < 3; ++i) {
    INFO(pruned[i].readable);
    CHECK(pruned[i].removed);
  }
  CHECK(present(tmp.path, "new_op"));
  CHECK(present(tmp.path, "busy_op"));
  CHECK(present(tmp.path, "oldnvrtc_op"));
  CHECK(entries(tmp.path).size() == 3);
}

// Issue 15 defect 9: torch's NVRTC and the toolkit's on one machine each use
// their own entries; prune keeps the newest generator's entries of every NVRTC.
TEST_CASE("disk cache: prune keeps the newest entries of every NVRTC version[current=generator 3 nvrtc 13.0]") {
  TempDir tmp;
  const std::string current = "generator 3 nvrtc 13.0";
  store(tmp.path, "ours_op", 0, current);
  store(tmp.path, "ours_old_op", 0, "generator 2 nvrtc 13.0");
  store(tmp.path, "torch_op", 0, "generator 3 nvrtc 13.2");      // the package's NVRTC: kept
  store(tmp.path, "torch_old_op", 0, "generator 1 nvrtc 13.2");  // older than torch_op: removed
  store(tmp.path, "other12_op", 0, "generator 1 nvrtc 12.8");    // the only one of 12.8: kept
  store(tmp.path, "newer_op", 0, "generator 4 nvrtc 13.0");      // a newer kdtree on the same NVRTC: kept
  store(tmp.path, "odd_op", 0, "some other tag");                // not our tag form, not current: removed
  const auto pruned = DiskCache(tmp.path).prune(current);
  std::vector<std::string> names;
  for (const EntryInfo& e : pruned) {
    CHECK(e.removed);
    names.push_back(e.readable);
  }
  CHECK(names == std::vector<std::string>{"odd_op", "ours_old_op", "torch_old_op"});
  for (const char* kept : {"ours_op", "torch_op", "other12_op", "newer_op"}) {
    INFO(kept);
    CHECK(present(tmp.path, kept));
  }
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

// Issue 15 defect 6: a bogus *.kdc (here a sparse 3 GiB file with an entry's
// name) counted toward the limit and pushed every valid entry out.
TEST_CASE("disk cache: a bogus oversized entry neither counts nor evicts valid ones[sparse 3 GiB]") {
  TempDir tmp;
  const std::uint64_t max = 3 * kEntryBytes;
  store(tmp.path, "a_op", max);
  store(tmp.path, "b_op", max);
  const fs::path bogus = entry_path(tmp.path, "bogus_op");
  const fs::path foreign = tmp.path / "notes.kdc";  // not an entry name: neither counted nor removed
  for (const fs::path& p : {bogus, foreign}) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    const bool sized = ::ftruncate(fd, off_t(3) << 30) == 0;  // sparse: no disk space used
    ::close(fd);
    REQUIRE(sized);
  }
  store(tmp.path, "c_op", max);
  CHECK(present(tmp.path, "a_op"));
  CHECK(present(tmp.path, "b_op"));
  CHECK(present(tmp.path, "c_op"));
  CHECK_FALSE(fs::exists(bogus));  // removed as bad
  CHECK(fs::exists(foreign));
}

// Issue 15 defect 7: stale temporary files took space outside the limit.
TEST_CASE("disk cache: eviction removes stale temporary files[own stale, own recent, foreign]") {
  TempDir tmp;
  const fs::path stale = tmp.path / own_temp_name(entry_path(tmp.path, "a_op").filename().string());
  const fs::path recent = tmp.path / own_temp_name(entry_path(tmp.path, "b_op").filename().string());
  const fs::path foreign = tmp.path / "draft.tmp.4000001";
  for (const fs::path& p : {stale, recent, foreign}) write_file(p, std::string(5000, 't'));
  set_last_use(stale, 2 * 3600);
  set_last_use(foreign, 2 * 3600);
  store(tmp.path, "c_op", 10 * kEntryBytes);  // under the limit: nothing else to evict
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(recent));  // may be a publish in progress
  CHECK(fs::exists(foreign));
  CHECK(present(tmp.path, "c_op"));
}
