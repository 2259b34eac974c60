#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

#include "base/error.hpp"

namespace fs = std::filesystem;

namespace kdtree::cache {

struct DiskCache::Slot {
  std::mutex mutex;  // held while this key is loaded or built
  bool ready = false;
  std::vector<char> payload;
};

namespace {

constexpr char kMagic[4] = {'K', 'D', 'T', 'C'};
constexpr std::uint32_t kFormatVersion = 1;
// magic, version, payload size, payload SHA-256, key SHA-256 (integers little-endian)
constexpr std::size_t kHeaderSize = 4 + 4 + 8 + 32 + 32;
constexpr const char* kEntryExt = ".kdc";
constexpr const char* kLockExt = ".lock";
constexpr const char* kTempMark = ".tmp.";
// Leaves room in a 255-byte file name for the hash, extensions and temp suffix.
constexpr std::size_t kMaxReadable = 150;
// A temp file this old is abandoned even if its pid is now someone else's.
constexpr auto kStaleTempAge = std::chrono::hours(1);

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ".tmp.<pid>.<thread>.<counter>": unique across processes, threads and calls.
std::string temp_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%ld.%zx.%llu", kTempMark, long(::getpid()),
                std::hash<std::thread::id>{}(std::this_thread::get_id()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

void put_le(std::vector<char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char(std::uint8_t(v >> (8 * i))));
}

std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(std::uint8_t(p[i])) << (8 * i);
  return v;
}

std::vector<char> make_header(const std::vector<char>& payload, const Digest& key) {
  std::vector<char> h(kMagic, kMagic + 4);
  put_le(h, kFormatVersion, 4);
  put_le(h, payload.size(), 8);
  const Digest sum = Sha256::hash(payload.data(), payload.size());
  h.insert(h.end(), sum.begin(), sum.end());
  h.insert(h.end(), key.begin(), key.end());
  return h;
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= std::size_t(w);
  }
  return true;
}

struct Entry {
  enum class State { missing, bad, ok } state = State::missing;
  std::string problem;
  std::vector<char> payload;
  dev_t dev = 0;
  ino_t ino = 0;
};

// Reads and checks an entry. The key is checked against `key` when given, else
// against `hash16` (the prefix in the file name).
Entry read_entry(const fs::path& path, const Digest* key, const std::string& hash16) {
  Entry e;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return e;
    e.state = Entry::State::bad;
    e.problem = "cannot open: " + errno_text(errno);
    return e;
  }
  e.state = Entry::State::bad;
  struct stat st {};
  std::vector<char> bytes;
  int read_errno = 0;
  if (::fstat(fd, &st) != 0) {
    read_errno = errno;
  } else if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    e.problem = "not a regular file";
    return e;
  } else {
    e.dev = st.st_dev;
    e.ino = st.st_ino;
    bytes.resize(std::size_t(st.st_size));
    std::size_t got = 0;
    while (got < bytes.size()) {
      ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) read_errno = errno;
      if (r <= 0) break;
      got += std::size_t(r);
    }
    bytes.resize(got);  // a file that shrank while read fails the size check below
  }
  ::close(fd);
  if (read_errno != 0) {
    e.problem = "cannot read: " + errno_text(read_errno);
    return e;
  }
  if (bytes.size() < kHeaderSize) {
    e.problem = "truncated header (" + std::to_string(bytes.size()) + " bytes)";
    return e;
  }
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    e.problem = "bad magic";
    return e;
  }
  const auto version = get_le(bytes.data() + 4, 4);
  if (version != kFormatVersion) {
    e.problem = "format version " + std::to_string(version) + ", expected " +
                std::to_string(kFormatVersion);
    return e;
  }
  const auto size = get_le(bytes.data() + 8, 8);
  const std::size_t have = bytes.size() - kHeaderSize;
  if (size != have) {
    e.problem = "payload size " + std::to_string(size) + " but the file holds " +
                std::to_string(have) + " bytes" + (size > have ? " (truncated)" : "");
    return e;
  }
  Digest stored_key;
  std::memcpy(stored_key.data(), bytes.data() + 48, 32);
  if (key ? stored_key != *key : to_hex(stored_key).compare(0, 16, hash16) != 0) {
    e.problem = "key hash mismatch";
    return e;
  }
  const Digest sum = Sha256::hash(bytes.data() + kHeaderSize, have);
  if (std::memcmp(sum.data(), bytes.data() + 16, 32) != 0) {
    e.problem = "payload checksum mismatch";
    return e;
  }
  e.payload.assign(bytes.begin() + kHeaderSize, bytes.end());
  e.state = Entry::State::ok;
  return e;
}

// Writes the entry to a temporary file in the same directory, flushes it and
// renames it over `path`, so readers see the old entry or the new, never a
// part. Returns "" or what failed.
std::string publish(const fs::path& path, const std::vector<char>& payload, const Digest& key) {
  const std::string tmp = path.string() + temp_suffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create " + tmp + ": " + errno_text(errno);
  const std::vector<char> header = make_header(payload, key);
  std::string failed;
  if (!write_all(fd, header.data(), header.size()) ||
      !write_all(fd, payload.data(), payload.size())) {
    failed = "cannot write " + tmp + ": " + errno_text(errno);
  } else if (::fsync(fd) != 0) {
    failed = "cannot flush " + tmp + ": " + errno_text(errno);
  }
  if (::close(fd) != 0 && failed.empty()) failed = "cannot close " + tmp + ": " + errno_text(errno);
  if (failed.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    failed = "cannot rename " + tmp + ": " + errno_text(errno);
  }
  if (!failed.empty()) {
    ::unlink(tmp.c_str());
    return failed;
  }
  // Make the rename itself durable; an entry lost on power failure is only rebuilt.
  int dfd = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(),
                   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return "";
}

// An exclusive flock on <entry>.lock. The holder unlinks the file before
// unlocking; a waiter that then gets the lock on the unlinked inode notices
// (inode differs from the path's) and retries on the new file, so removal never
// lets two processes hold "the" lock at once.
class FileLock {
 public:
  FileLock() = default;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ < 0) return;
    // Unlink only our own file: clear() may have replaced it with another's.
    struct stat held {}, at_path {};
    if (owns_path_ && ::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 &&
        held.st_dev == at_path.st_dev && held.st_ino == at_path.st_ino) {
      ::unlink(path_.c_str());
    }
    ::close(fd_);
  }

  // Returns 0 with the lock held (or unlockable: file system without flock),
  // else the errno of creating the lock file. Throws KDTREE_ERROR_CACHE on timeout.
  int acquire(const fs::path& path, const std::string& readable, std::chrono::seconds timeout) {
    path_ = path;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool announced = false;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) return errno;
      for (;;) {
        if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) break;
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK) return 0;  // no flock here: publish is still atomic
        if (!announced) {
          const std::string msg = "kdtree: waiting for another process to compile " + readable +
                                  " (lock " + path.string() + ")\n";
          std::fputs(msg.c_str(), stderr);
          announced = true;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
          ::close(fd_);
          fd_ = -1;
          fail(KDTREE_ERROR_CACHE, "kdtree: timed out after " + std::to_string(timeout.count()) +
                                       " s waiting for cache lock " + path.string() +
                                       " (held by another process compiling " + readable + ")");
        }
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
      }
      struct stat held {}, now_at_path {};
      if (::fstat(fd_, &held) == 0 && ::stat(path.c_str(), &now_at_path) == 0 &&
          held.st_dev == now_at_path.st_dev && held.st_ino == now_at_path.st_ino) {
        owns_path_ = true;
        return 0;
      }
      ::close(fd_);  // the file was removed or replaced while we waited
      fd_ = -1;
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
  bool owns_path_ = false;
};

// "<readable>-<16 hex>.kdc" -> readable and hash16; false when the name is not one.
bool parse_entry_name(const std::string& name, std::string* readable, std::string* hash16) {
  if (!ends_with(name, kEntryExt)) return false;
  const std::string stem = name.substr(0, name.size() - std::strlen(kEntryExt));
  const auto dash = stem.rfind('-');
  if (dash == std::string::npos || dash == 0 || stem.size() - dash - 1 != 16) return false;
  *readable = stem.substr(0, dash);
  *hash16 = stem.substr(dash + 1);
  return std::all_of(hash16->begin(), hash16->end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A temp file whose writer is gone (or that is too old to be in progress).
bool stale_temp(const fs::path& path, const std::string& name) {
  const auto mark = name.rfind(kTempMark);
  if (mark == std::string::npos) return false;
  const long pid = std::strtol(name.c_str() + mark + std::strlen(kTempMark), nullptr, 10);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const auto age = std::chrono::system_clock::now() -
                   std::chrono::system_clock::from_time_t(st.st_mtime);
  if (age > kStaleTempAge) return true;
  if (pid <= 0 || pid == long(::getpid())) return false;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

DiskCache::DiskCache(fs::path dir, std::chrono::seconds lock_timeout)
    : dir_(std::move(dir)), lock_timeout_(lock_timeout) {
  if (dir_.empty()) {
    memory_only_ = true;
    return;
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    degrade(ec.message());
    return;
  }
  if (!fs::is_directory(dir_, ec)) {
    degrade("not a directory");
    return;
  }
  // Creating the directory can succeed (or be unnecessary) where files cannot
  // be written: probe with a real file.
  const fs::path probe = dir_ / ("probe" + temp_suffix());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    degrade(errno_text(errno));
    return;
  }
  ::close(fd);
  if (::unlink(probe.c_str()) != 0) degrade("cannot remove files: " + errno_text(errno));
}

DiskCache::~DiskCache() = default;

fs::path DiskCache::default_dir() {
  if (std::string d = env("KDTREE_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return fs::path(d) / "kdtree";
  std::string home = env("HOME");
  if (home.empty()) {
    if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (home.empty()) return {};  // nowhere to put it: memory only
  return fs::path(home) / ".cache" / "kdtree";
}

std::string DiskCache::sha256_hex(const std::string& data) { return to_hex(Sha256::hash(data)); }

void DiskCache::degrade(const std::string& why) {
  if (memory_only_.exchange(true)) return;
  const std::string msg = "kdtree: warning: cache directory " + dir_.string() +
                          " is not writable (" + why + "); caching in memory only\n";
  std::fputs(msg.c_str(), stderr);
}

std::shared_ptr<DiskCache::Slot> DiskCache::slot(const std::string& key_hex) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto& s = memory_[key_hex];
  if (!s) s = std::make_shared<Slot>();
  return s;
}

std::vector<char> DiskCache::get_or_build(const std::string& readable,
                                          const std::string& key_material,
                                          const std::function<std::vector<char>()>& build,
                                          Outcome* outcome) {
  require(!readable.empty() && readable.size() <= kMaxReadable && readable[0] != '.' &&
              readable.find_first_of(std::string("/\\\0", 3)) == std::string::npos,
          "cache: readable name '" + readable +
              "' is not a safe file name (1.." + std::to_string(kMaxReadable) +
              " characters, no '/', not starting with '.')");
  require(bool(build), "cache: no build function for " + readable);
  const Digest key = Sha256::hash(key_material);
  std::shared_ptr<Slot> s = slot(to_hex(key));
  std::lock_guard<std::mutex> guard(s->mutex);  // same key: one thread builds, the others wait
  if (s->ready) {
    if (outcome) *outcome = Outcome::memory_hit;
    return s->payload;
  }
  Outcome how = Outcome::built;
  s->payload = load_or_build(readable, key, build, &how);
  s->ready = true;
  if (outcome) *outcome = how;
  return s->payload;
}

std::vector<char> DiskCache::load_or_build(const std::string& readable, const Digest& key,
                                           const std::function<std::vector<char>()>& build,
                                           Outcome* outcome) {
  *outcome = Outcome::built;
  if (dir_.empty()) return build();
  const std::string name = readable + "-" + to_hex(key).substr(0, 16) + kEntryExt;
  const fs::path path = dir_ / name;
  // A degraded cache still reads valid entries (e.g. a pre-warmed read-only dir).
  Entry found = read_entry(path, &key, "");
  if (found.state == Entry::State::ok) {
    *outcome = Outcome::disk_hit;
    return std::move(found.payload);
  }
  if (memory_only_) return build();

  FileLock lock;
  const fs::path lock_path = path.string() + kLockExt;
  int err = lock.acquire(lock_path, readable, lock_timeout_);
  if (err == ENOENT) {  // the directory was removed under us: make it again
    std::error_code ec;
    fs::create_directories(dir_, ec);
    err = lock.acquire(lock_path, readable, lock_timeout_);
  }
  if (err != 0) {
    degrade("cannot create " + lock_path.string() + ": " + errno_text(err));
    return build();
  }
  // Another process may have published while we waited for the lock.
  found = read_entry(path, &key, "");
  if (found.state == Entry::State::ok) {
    *outcome = Outcome::disk_hit;
    return std::move(found.payload);
  }
  std::vector<char> payload = build();  // throws: the lock is released, nothing published
  if (std::string failed = publish(path, payload, key); !failed.empty()) degrade(failed);
  return payload;
}

std::vector<EntryInfo> DiskCache::list() const {
  std::vector<EntryInfo> out;
  if (dir_.empty()) return out;
  std::error_code ec;
  fs::directory_iterator it(dir_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!ends_with(name, kEntryExt)) continue;
    EntryInfo info;
    info.path = it->path();
    std::error_code size_ec;
    info.bytes = fs::file_size(info.path, size_ec);
    if (size_ec) info.bytes = 0;
    std::string hash16;
    if (!parse_entry_name(name, &info.readable, &hash16)) {
      info.readable = name.substr(0, name.size() - std::strlen(kEntryExt));
      info.problem = "file name is not <readable>-<16 hex digits>.kdc";
    } else {
      Entry e = read_entry(info.path, nullptr, hash16);
      info.valid = e.state == Entry::State::ok;
      if (e.state == Entry::State::missing) info.problem = "removed while listing";
      else info.problem = e.problem;
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const EntryInfo& a, const EntryInfo& b) { return a.path < b.path; });
  return out;
}

std::vector<EntryInfo> DiskCache::verify() {
  std::vector<EntryInfo> entries = list();
  for (const EntryInfo& info : entries) {
    if (info.valid) continue;
    // Re-check right before removing: another process may have just replaced
    // the bad entry with a good one (publish renames over it).
    std::string readable, hash16;
    if (parse_entry_name(info.path.filename().string(), &readable, &hash16)) {
      const Entry again = read_entry(info.path, nullptr, hash16);
      if (again.state != Entry::State::bad) continue;
      struct stat st {};
      if (::stat(info.path.c_str(), &st) != 0 || st.st_dev != again.dev || st.st_ino != again.ino) {
        continue;
      }
    }
    std::error_code ec;
    fs::remove(info.path, ec);
  }
  return entries;
}

std::size_t DiskCache::clear() {
  std::size_t removed = 0;
  if (dir_.empty()) return 0;
  std::vector<fs::path> doomed;
  std::error_code ec;
  fs::directory_iterator it(dir_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, kEntryExt) || ends_with(name, kLockExt) ||
        (name.find(kTempMark) != std::string::npos && stale_temp(it->path(), name))) {
      doomed.push_back(it->path());
    }
  }
  for (const fs::path& p : doomed) {
    std::error_code rm_ec;
    if (fs::remove(p, rm_ec)) ++removed;
  }
  return removed;
}

}  // namespace kdtree::cache
