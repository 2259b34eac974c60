// The on-disk cubin cache.
//
// Layout: <dir>/<readable>-<hash16>.kdc, where readable names the operation,
// shape, dtype and arch, and hash16 is the first 16 hex digits of the SHA-256 of
// the key material (rendered source, options, arch, NVRTC and generator versions).
// Entry = header {magic "KDTC", format version, payload size, payload SHA-256,
// full key hash} + payload. A bad entry (magic, version, size, checksum, key) is
// never loaded: it is rebuilt and replaced.
//
// Publish is atomic (temporary file in the same directory, flushed, renamed).
// A per-key lock file (<entry>.lock, flock) makes concurrent processes build a
// key once; a waiter prints one message and gives up after a timeout.
// An unwritable directory degrades to memory only, with one warning on stderr
// (valid entries already there are still read). Within a process, results are
// memoised and every method is thread-safe.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cache/sha256.hpp"

namespace kdtree::cache {

enum class Outcome {
  memory_hit,  // already loaded in this process
  disk_hit,    // read from a valid entry
  built,       // built here (miss, or a bad entry replaced)
};

struct EntryInfo {
  std::filesystem::path path;
  std::string readable;    // file name without hash and extension
  std::uintmax_t bytes = 0;
  bool valid = false;
  std::string problem;     // why not valid ("" when valid)
};

class DiskCache {
 public:
  // dir: the cache directory (created if missing). Empty path = memory only.
  explicit DiskCache(std::filesystem::path dir,
                     std::chrono::seconds lock_timeout = std::chrono::seconds(600));
  ~DiskCache();

  // KDTREE_CACHE_DIR, else $XDG_CACHE_HOME/kdtree, else $HOME/.cache/kdtree.
  static std::filesystem::path default_dir();

  // Returns the payload for key_material. On a miss, `build` runs (at most once
  // per key across threads and across processes that share the directory) and
  // its result is published. `readable` must be file-name safe.
  std::vector<char> get_or_build(const std::string& readable, const std::string& key_material,
                                 const std::function<std::vector<char>()>& build,
                                 Outcome* outcome = nullptr);

  std::vector<EntryInfo> list() const;       // every *.kdc entry, checked
  std::vector<EntryInfo> verify();           // like list(); bad entries are removed
  std::size_t clear();                       // removes entries and stale temp/lock files; returns count

  const std::filesystem::path& dir() const { return dir_; }
  bool memory_only() const { return memory_only_; }

  static std::string sha256_hex(const std::string& data);

 private:
  struct Slot;  // one key's in-process state; its mutex serialises the build

  std::shared_ptr<Slot> slot(const std::string& key_hex);
  std::vector<char> load_or_build(const std::string& readable, const Digest& key,
                                  const std::function<std::vector<char>()>& build,
                                  Outcome* outcome);
  void degrade(const std::string& why);  // switch to memory only; warns once

  std::filesystem::path dir_;
  std::chrono::seconds lock_timeout_;
  std::atomic<bool> memory_only_{false};
  mutable std::mutex mutex_;  // guards memory_ only (never held while building)
  std::map<std::string, std::shared_ptr<Slot>> memory_;
};

}  // namespace kdtree::cache
