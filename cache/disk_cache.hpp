// The on-disk cubin cache.
//
// Layout: <dir>/<readable>-<hash16>.kdc, where readable names the operation,
// shape, dtype and arch, and hash16 is the first 16 hex digits of the SHA-256 of
// the key material (rendered source, options, arch, NVRTC and generator versions).
// Entry (format 2) = header {magic "KDTC", format version, payload size, version
// tag size, checksum, full key hash} + version tag + payload. The checksum is the
// SHA-256 of every other byte of the file, so any corrupt byte (key included) is
// caught by list()/verify() too, not only by get_or_build. A bad entry (not a
// regular file, over kMaxEntryBytes, magic, format, size, key, checksum) is never
// loaded: it is rebuilt and replaced. Only lstat() and non-blocking,
// no-follow opens touch entry paths, so a FIFO, link or directory there cannot
// hang or redirect anything.
//
// Publish is atomic (temporary file in the same directory, flushed, renamed).
// A per-key lock file (<entry>.lock, flock) makes concurrent processes build a
// key once. A waiter prints one message and waits at most lock_timeout; then it
// compiles the key itself and goes on (a live but stuck holder cannot stall it).
//
// Temporary files are "<entry file name>.tmp.<pid>.<thread hex>.<counter>"
// (and the directory probe's "probe.tmp.<...>"). Only regular files with such a
// name are ever removed as temporary files, and only once stale: not modified
// for kStaleTempAge (1 hour; a writer writes, flushes and renames at once, so a
// live one is never that old). Age, not the pid in the name, decides: a writer
// in another PID namespace or on another host looks dead to a pid check.
//
// Size limit: after each publish, entries are evicted least recently used first
// (by mtime, which a disk hit refreshes, so atime/noatime does not matter) until
// the *.kdc files total at most max_bytes. Only entries that can be valid count
// (a regular file with an entry name, a header of the right magic, and the size
// that header gives, at most kMaxEntryBytes); a bogus one (e.g. a sparse 3 GB
// file) is removed as bad, and stale temporary files are removed too. An entry
// whose lock another process holds is never evicted, nor is the one just
// published.
//
// An unwritable directory degrades to memory only, with one warning on stderr
// (valid entries already there are still read); so does an empty path (no
// cache directory could be determined). A store that fails for one entry (its
// rename fails, the disk is full) fails that entry only: a warning names it and
// later entries are still stored. Within a process, results are memoised and
// every method is thread-safe.
//
// A payload check (Options::payload_check) lets the owner of the payload format
// reject an entry whose checksum is right but whose payload does not unpack: it
// is then a bad entry like any other (rebuilt, reported and removed by verify).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/sha256.hpp"

namespace kdtree::cache {

enum class Outcome {
  memory_hit,  // already loaded in this process
  disk_hit,    // read from a valid entry
  built,       // built here (miss, a bad entry replaced, or a lock wait that timed out)
};

struct EntryInfo {
  enum class Kind {
    entry,  // <readable>-<hash16>.kdc (whatever file type is there)
    temp,   // a stale temporary file of kdtree's own name pattern, unmodified for kStaleTempAge
    lock,   // an unheld lock file (only reported by clear())
  };
  Kind kind = Kind::entry;
  std::filesystem::path path;
  std::string readable;  // file name without hash and extension (temp/lock: the file name)
  std::uintmax_t bytes = 0;
  bool valid = false;
  std::string problem;                                // why not valid ("" when valid)
  std::string version;                                // the version tag it was stored with ("" when unreadable)
  std::chrono::system_clock::time_point last_used{};  // mtime: publish or last disk hit
  // Set by verify(), clear(), prune(): whether this file was removed, else why not.
  bool removed = false;
  std::string remove_error;
};

// "" when the payload of a checksum-valid entry unpacks, else why not.
using PayloadCheck = std::function<std::string(const std::vector<char>& payload)>;

class DiskCache {
 public:
  // The largest entry file read (header + tag + payload); a bigger one is corrupt.
  static constexpr std::uintmax_t kMaxEntryBytes = std::uintmax_t(256) << 20;
  static constexpr std::chrono::milliseconds kDefaultLockTimeout{60'000};
  static constexpr std::uint64_t kDefaultMaxBytes = std::uint64_t(2) << 30;
  // A temporary file unmodified this long is abandoned (its writer crashed).
  static constexpr std::chrono::hours kStaleTempAge{1};

  struct Options {
    // Longest wait for another process's lock on a key (>= 0); nullopt = lock_timeout_from_env().
    std::optional<std::chrono::milliseconds> lock_timeout;
    // Size limit of all entries in bytes, 0 = unlimited; nullopt = max_bytes_from_env().
    std::optional<std::uint64_t> max_bytes;
    // Checks payloads read from disk (see above); empty = any payload.
    PayloadCheck payload_check;
    // Inspect only (list, verify, clear, prune): the directory is neither created
    // nor probed, nothing warns about memory only, and get_or_build stores nothing.
    bool inspect_only = false;
  };

  // dir: the cache directory (created if missing). Empty path = memory only,
  // with one warning (no cache directory could be determined).
  // lock_timeout: longest wait for another process's lock on a key (>= 0);
  //   nullopt = lock_timeout_from_env().
  // max_bytes: size limit of all entries in bytes, 0 = unlimited; nullopt =
  //   max_bytes_from_env().
  // Throws KDTREE_ERROR_INVALID_ARGUMENT for a malformed environment variable.
  explicit DiskCache(std::filesystem::path dir, std::optional<std::chrono::milliseconds> lock_timeout = std::nullopt,
                     std::optional<std::uint64_t> max_bytes = std::nullopt);
  DiskCache(std::filesystem::path dir, Options options);
  ~DiskCache();

  // KDTREE_CACHE_DIR, else $XDG_CACHE_HOME/kdtree, else $HOME/.cache/kdtree, else
  // the passwd home's .cache/kdtree; empty when there is none of these (a
  // passwd lookup that fails, rather than finding no user, warns on stderr).
  static std::filesystem::path default_dir();
  // KDTREE_CACHE_LOCK_TIMEOUT: seconds, a decimal number 0..86400 (e.g. 0.5; digits and one '.' only);
  // unset or empty: kDefaultLockTimeout.
  static std::chrono::milliseconds lock_timeout_from_env();
  // KDTREE_CACHE_MAX_BYTES: bytes, an integer with an optional K, M, G or T suffix
  // (powers of 1024); 0 = unlimited; unset or empty: kDefaultMaxBytes.
  static std::uint64_t max_bytes_from_env();
  // Creates dir if needed and checks that files can be created and removed in it:
  // "" when usable, else why not. Prints nothing.
  static std::string unusable_reason(const std::filesystem::path& dir);

  // Returns the payload for key_material. On a miss, `build` runs (at most once
  // per key across threads and across processes that share the directory, unless
  // a lock wait times out) and its result is published with the version tag
  // `version` (what prune() compares). `readable` must be file-name safe.
  // not_stored (when given): "" unless a payload built by this call could not
  // be stored because of its own entry path (e.g. a non-empty directory there,
  // or at its lock path), then why, naming that path. A directory that fails
  // as a whole is memory_only() instead.
  std::vector<char> get_or_build(const std::string& readable, const std::string& key_material,
                                 const std::function<std::vector<char>()>& build, Outcome* outcome = nullptr,
                                 const std::string& version = "", std::string* not_stored = nullptr);

  // Every entry path (*.kdc, whatever file type) and every stale temporary file,
  // checked, sorted by path. Changes nothing. list, verify, clear and prune throw
  // KDTREE_ERROR_CACHE when the directory cannot be read (e.g. no permission);
  // a directory that does not exist lists as empty.
  std::vector<EntryInfo> list() const;
  // Like list(); bad entries and stale temporary files are removed (removed /
  // remove_error say how that went).
  std::vector<EntryInfo> verify();
  // Removes every entry, stale temporary file and unheld lock file; a lock that
  // a live process holds is left alone. Returns what it tried to remove.
  std::vector<EntryInfo> clear();
  // Removes entries of an older format, and entries whose version tag is not
  // `current_version` unless they are the newest of their NVRTC version: tags
  // "generator G nvrtc N" are grouped by N and, in each group, those of the
  // highest G (counting current_version's) are kept, so a second NVRTC on the
  // machine (e.g. torch's next to the toolkit's) keeps its entries. A tag of
  // another form is removed when it differs from current_version. Skips entries
  // whose lock is held (reported as not removed). Returns what it tried.
  std::vector<EntryInfo> prune(const std::string& current_version);

  const std::filesystem::path& dir() const { return dir_; }
  bool memory_only() const { return memory_only_; }
  std::chrono::milliseconds lock_timeout() const { return lock_timeout_; }
  std::uint64_t max_bytes() const { return max_bytes_; }

  static std::string sha256_hex(const std::string& data);

 private:
  struct Slot;  // one key's in-process state; its mutex serialises the build

  std::shared_ptr<Slot> slot(const std::string& key_hex);
  std::vector<char> load_or_build(const std::string& readable, const Digest& key,
                                  const std::function<std::vector<char>()>& build, Outcome* outcome,
                                  const std::string& version, std::string* not_stored);
  void degrade(const std::string& why);           // switch to memory only; warns once
  void evict(const std::filesystem::path& keep);  // LRU down to max_bytes_

  std::filesystem::path dir_;
  std::chrono::milliseconds lock_timeout_;
  std::uint64_t max_bytes_;
  PayloadCheck payload_check_;
  bool inspect_only_ = false;
  std::atomic<bool> memory_only_{false};
  mutable std::mutex mutex_;  // guards memory_ only (never held while building)
  std::map<std::string, std::shared_ptr<Slot>> memory_;
};

}  // namespace kdtree::cache
