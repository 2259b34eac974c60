#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/passwd_home.hpp"
#include "base/posix_io.hpp"

namespace fs = std::filesystem;

namespace kdtree::cache {

struct DiskCache::Slot {
  std::mutex mutex;  // held while this key is loaded or built
  bool ready = false;
  std::vector<char> payload;
};

namespace {

constexpr char kMagic[4] = {'K', 'D', 'T', 'C'};
// 2: version tag, checksum over the whole file (1 covered the payload only).
constexpr std::uint32_t kFormatVersion = 2;
// magic 4, format 4, payload size 8, tag size 4, checksum 32, key SHA-256 32
// (integers little-endian), then the tag and the payload.
constexpr std::size_t kChecksumAt = 20;
constexpr std::size_t kKeyAt = 52;
constexpr std::size_t kHeaderSize = 84;
constexpr std::size_t kMaxTag = 1024;
constexpr const char* kEntryExt = ".kdc";
constexpr const char* kLockExt = ".lock";
constexpr const char* kTempMark = ".tmp.";
// Leaves room in a 255-byte file name for the hash, extensions and temp suffix.
constexpr std::size_t kMaxReadable = 150;
// The directory probe's temp file (unusable_reason) starts with this.
constexpr const char* kProbeName = "probe";

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

// SHA-256 of every byte of the entry except the checksum field: the header
// (kHeaderSize bytes), the tag and the payload. The one hashing path of both
// the writer and the reader.
Digest entry_checksum(const char* header, const char* tag, std::size_t tag_size, const char* payload,
                      std::size_t payload_size) {
  Sha256 h;
  h.update(header, kChecksumAt);
  h.update(header + kKeyAt, kHeaderSize - kKeyAt);
  h.update(tag, tag_size);
  h.update(payload, payload_size);
  return h.finish();
}

// Header + tag (the payload follows).
std::vector<char> make_prefix(const std::vector<char>& payload, const Digest& key, const std::string& tag) {
  std::vector<char> h(kMagic, kMagic + 4);
  put_le(h, kFormatVersion, 4);
  put_le(h, payload.size(), 8);
  put_le(h, tag.size(), 4);
  h.resize(kKeyAt);  // checksum, filled in below
  h.insert(h.end(), key.begin(), key.end());
  h.insert(h.end(), tag.begin(), tag.end());
  const Digest d = entry_checksum(h.data(), h.data() + kHeaderSize, tag.size(), payload.data(), payload.size());
  std::copy(d.begin(), d.end(), h.begin() + kChecksumAt);
  return h;
}

// What is at a path that should hold a regular file, in words ("" = regular file).
std::string not_regular(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISLNK(mode)) return "a symbolic link, not a regular file";
  if (S_ISDIR(mode)) return "a directory, not a regular file";
  if (S_ISFIFO(mode)) return "a FIFO, not a regular file";
  if (S_ISSOCK(mode)) return "a socket, not a regular file";
  return "a device, not a regular file";
}

struct Entry {
  enum class State { missing, bad, ok } state = State::missing;
  std::string problem;
  std::vector<char> payload;
  std::string tag;
  std::uint32_t format = 0;  // 0 when unreadable
  bool is_dir = false;
  bool stat_ok = false;  // st holds the path's lstat (its fstat once opened)
  struct stat st {};
};

// Reads and checks an entry. The key is checked against `key` when given, else
// against `hash16` (the prefix in the file name). Never blocks on or follows
// what is at the path, and never reads more than kMaxEntryBytes.
Entry read_entry(const fs::path& path, const Digest* key, const std::string& hash16, const PayloadCheck& check) {
  Entry e;
  if (::lstat(path.c_str(), &e.st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return e;
    e.state = Entry::State::bad;
    e.problem = "cannot stat: " + errno_text(errno);
    return e;
  }
  e.stat_ok = true;
  e.state = Entry::State::bad;
  e.is_dir = S_ISDIR(e.st.st_mode);
  if (std::string what = not_regular(e.st.st_mode); !what.empty()) {
    e.problem = what;
    return e;
  }
  auto too_large = [&](std::uintmax_t size) {
    e.problem = "too large (" + std::to_string(size) + " bytes; an entry is at most " +
                std::to_string(DiskCache::kMaxEntryBytes) + ")";
  };
  if (std::uintmax_t(e.st.st_size) > DiskCache::kMaxEntryBytes) {
    too_large(std::uintmax_t(e.st.st_size));
    return e;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      e.state = Entry::State::missing;
      return e;
    }
    e.problem = "cannot open: " + errno_text(errno);
    return e;
  }
  struct stat st {};
  std::vector<char> bytes;
  int read_errno = 0;
  if (::fstat(fd, &st) != 0) {
    read_errno = errno;
  } else if (!S_ISREG(st.st_mode)) {  // replaced after the lstat
    ::close(fd);
    e.problem = not_regular(st.st_mode);
    return e;
  } else if (std::uintmax_t(st.st_size) > DiskCache::kMaxEntryBytes) {
    ::close(fd);
    too_large(std::uintmax_t(st.st_size));
    return e;
  } else {
    e.st = st;
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
  e.format = std::uint32_t(get_le(bytes.data() + 4, 4));
  if (e.format != kFormatVersion) {
    e.problem = "format version " + std::to_string(e.format) + ", expected " + std::to_string(kFormatVersion);
    return e;
  }
  const std::uint64_t size = get_le(bytes.data() + 8, 8);
  const std::uint64_t tag_size = get_le(bytes.data() + 16, 4);
  if (tag_size > kMaxTag || tag_size > bytes.size() - kHeaderSize) {
    e.problem = "version tag size " + std::to_string(tag_size) + " is impossible";
    return e;
  }
  const std::size_t have = bytes.size() - kHeaderSize - std::size_t(tag_size);
  if (size != have) {
    e.problem = "payload size " + std::to_string(size) + " but the file holds " + std::to_string(have) + " bytes" +
                (size > have ? " (truncated)" : "");
    return e;
  }
  Digest stored_key;
  std::memcpy(stored_key.data(), bytes.data() + kKeyAt, 32);
  if (key ? stored_key != *key : to_hex(stored_key).compare(0, 16, hash16) != 0) {
    e.problem = "key hash mismatch";
    return e;
  }
  const char* tag = bytes.data() + kHeaderSize;
  const Digest sum = entry_checksum(bytes.data(), tag, std::size_t(tag_size), tag + tag_size, std::size_t(size));
  if (std::memcmp(sum.data(), bytes.data() + kChecksumAt, 32) != 0) {
    e.problem = "checksum mismatch";
    return e;
  }
  e.tag.assign(bytes.data() + kHeaderSize, std::size_t(tag_size));
  e.payload.assign(bytes.begin() + std::ptrdiff_t(kHeaderSize + tag_size), bytes.end());
  // A right checksum over a payload that does not unpack (written so, or by a
  // bug) would otherwise fail its kernel on every load: it is a bad entry.
  if (check) {
    if (std::string why = check(e.payload); !why.empty()) {
      e.problem = "payload: " + why;
      e.payload.clear();
      return e;
    }
  }
  e.state = Entry::State::ok;
  return e;
}

// Writes the entry to a temporary file in the same directory, flushes it and
// renames it over `path`, so readers see the old entry or the new, never a part.
// Returns "" or why it was not stored (the temporary file is removed).
std::string publish(const fs::path& path, const std::vector<char>& payload, const Digest& key, const std::string& tag) {
  const std::string tmp = path.string() + temp_suffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create " + tmp + ": " + errno_text(errno);
  const std::vector<char> prefix = make_prefix(payload, key, tag);
  std::string failed;
  if (!write_all(fd, prefix.data(), prefix.size()) || !write_all(fd, payload.data(), payload.size())) {
    failed = "cannot write " + tmp + ": " + errno_text(errno);
  } else if (::fsync(fd) != 0) {
    failed = "cannot flush " + tmp + ": " + errno_text(errno);
  }
  if (::close(fd) != 0 && failed.empty()) failed = "cannot close " + tmp + ": " + errno_text(errno);
  if (failed.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    failed = "cannot rename " + tmp + " to " + path.filename().string() + ": " + errno_text(errno);
  }
  if (!failed.empty()) {
    ::unlink(tmp.c_str());
    return failed;
  }
  // Make the rename itself durable; an entry lost on power failure is only rebuilt.
  int dfd = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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
  enum class Result { held, timed_out, failed };

  FileLock() = default;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { release(); }

  // Waits up to `timeout` for the lock, calling on_wait once if it has to wait.
  // held also covers a file system without flock (publish is still atomic).
  // failed: *err is the errno of opening the lock file.
  Result acquire(const fs::path& path, std::chrono::milliseconds timeout, const std::function<void()>& on_wait,
                 int* err) {
    return attempt(path, std::chrono::steady_clock::now() + timeout, on_wait, true, err);
  }

  // Takes the lock only if nobody holds it. create: make the lock file if missing.
  // When not taken, *err is 0 (someone holds it) or the errno of opening it.
  bool try_acquire(const fs::path& path, bool create, int* err) {
    *err = 0;
    return attempt(path, std::chrono::steady_clock::time_point::min(), nullptr, create, err) == Result::held;
  }

  // Unlinks our lock file (when it is still ours) and unlocks: 0 or the errno of unlink.
  int release() {
    if (fd_ < 0) return 0;
    int result = 0;
    // Unlink only our own file: clear() may have replaced it with another's.
    struct stat held {
    }, at_path{};
    if (owns_path_ && ::fstat(fd_, &held) == 0 && ::lstat(path_.c_str(), &at_path) == 0 &&
        held.st_dev == at_path.st_dev && held.st_ino == at_path.st_ino && ::unlink(path_.c_str()) != 0) {
      result = errno;
    }
    ::close(fd_);
    fd_ = -1;
    owns_path_ = false;
    return result;
  }

 private:
  Result attempt(const fs::path& path, std::chrono::steady_clock::time_point deadline,
                 const std::function<void()>& on_wait, bool create, int* err) {
    path_ = path;
    bool announced = false;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT : 0);
      fd_ = ::open(path.c_str(), flags, 0644);
      if (fd_ < 0) {
        *err = errno;
        return Result::failed;
      }
      for (;;) {
        if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) break;
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK) return Result::held;  // no flock here
        if (!announced && on_wait) on_wait();           // also with a zero timeout: the caller says what it does
        announced = true;
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
          ::close(fd_);
          fd_ = -1;
          return Result::timed_out;
        }
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
      }
      struct stat held {
      }, now_at_path{};
      if (::fstat(fd_, &held) == 0 && ::lstat(path.c_str(), &now_at_path) == 0 && held.st_dev == now_at_path.st_dev &&
          held.st_ino == now_at_path.st_ino) {
        owns_path_ = true;
        return Result::held;
      }
      ::close(fd_);  // the file was removed or replaced while we waited
      fd_ = -1;
      if (!create) {
        *err = ENOENT;
        return Result::failed;
      }
    }
  }

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

// Whether name is one kdtree gives its temporary files (temp_suffix() after an
// entry's file name or kProbeName): anything else in the directory is not ours.
bool own_temp_name(const std::string& name) {
  const auto mark = name.rfind(kTempMark);
  if (mark == std::string::npos) return false;
  const std::string base = name.substr(0, mark);
  std::string readable, hash16;
  if (base != kProbeName && !parse_entry_name(base, &readable, &hash16)) return false;
  // <pid>.<thread hex>.<counter>
  const std::string rest = name.substr(mark + std::strlen(kTempMark));
  const auto dot1 = rest.find('.');
  const auto dot2 = dot1 == std::string::npos ? dot1 : rest.find('.', dot1 + 1);
  if (dot2 == std::string::npos) return false;
  auto all = [](const std::string& s, int (*is)(int)) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [is](char c) { return is(static_cast<unsigned char>(c)); });
  };
  return all(rest.substr(0, dot1), ::isdigit) && all(rest.substr(dot1 + 1, dot2 - dot1 - 1), ::isxdigit) &&
         all(rest.substr(dot2 + 1), ::isdigit);
}

// A temporary file to remove: a regular file of kdtree's name pattern that
// nobody has written for kStaleTempAge. By age, not by the pid in its name: a
// writer in another PID namespace or on another host would look dead. st: its lstat.
bool stale_temp(const std::string& name, const struct stat& st) {
  if (!S_ISREG(st.st_mode) || !own_temp_name(name)) return false;
  const auto age = std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtime);
  return age > DiskCache::kStaleTempAge;
}

// Removes a stale temporary file: unlink only, so never a directory (or what
// a link points to), even if one took its place since it was checked.
std::string remove_temp(const fs::path& path) {
  return ::unlink(path.c_str()) == 0 || errno == ENOENT ? "" : errno_text(errno);
}

// Iterates dir, calling fn for each path; throws KDTREE_ERROR_CACHE when the
// directory cannot be read (a missing one is empty), so that an unreadable
// cache is never reported as an empty one.
void for_each_file(const fs::path& dir, const std::function<void(const fs::path&)>& fn) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return;
  for (fs::directory_iterator end; !ec && it != end; it.increment(ec)) fn(it->path());
  if (ec) fail(KDTREE_ERROR_CACHE, "cannot list the cache directory " + dir.string() + ": " + ec.message());
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::chrono::system_clock::time_point mtime_of(const struct stat& st) {
  const auto since_epoch = std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(since_epoch));
}

// Removes whatever is at path (a directory with its contents; a link, not its
// target): "" or why not.
std::string remove_path(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : errno_text(errno);
  if (S_ISDIR(st.st_mode)) {
    std::error_code ec;
    fs::remove_all(path, ec);
    return ec ? ec.message() : "";
  }
  return ::unlink(path.c_str()) == 0 ? "" : errno_text(errno);
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// Removes the entry at path only while holding its lock (so never one that is
// being built or published) and only if it is still the file `seen`.
std::string remove_entry_locked(const fs::path& path, const struct stat& seen) {
  FileLock lock;
  int err = 0;
  if (!lock.try_acquire(path.string() + kLockExt, true, &err)) {
    return err ? "cannot lock it: " + errno_text(err) : "in use (another process holds its lock)";
  }
  struct stat now {};
  if (::lstat(path.c_str(), &now) != 0) return errno == ENOENT ? "" : errno_text(errno);
  if (!same_file(now, seen)) return "replaced while checked";
  return ::unlink(path.c_str()) == 0 ? "" : errno_text(errno);
}

// Whether a regular file (st: its lstat) can be an entry, from its size and
// header alone (evict() looks at every entry after each publish, so it does
// not read payloads): "" when it can, else why not. An entry of an older
// format can (it is evicted in its turn).
std::string entry_header_problem(const fs::path& path, const struct stat& st) {
  const auto size = std::uintmax_t(st.st_size);
  if (size > DiskCache::kMaxEntryBytes) return "too large";
  if (size < kHeaderSize) return "truncated header";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "cannot open: " + errno_text(errno);
  char h[kHeaderSize];
  std::size_t got = 0;
  while (got < kHeaderSize) {
    const ssize_t r = ::read(fd, h + got, kHeaderSize - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += std::size_t(r);
  }
  ::close(fd);
  if (got < kHeaderSize) return "truncated header";
  if (std::memcmp(h, kMagic, 4) != 0) return "bad magic";
  if (get_le(h + 4, 4) != kFormatVersion) return "";
  const std::uint64_t framed = kHeaderSize + get_le(h + 16, 4) + get_le(h + 8, 8);
  return framed == size ? "" : "size does not match its header";
}

std::string seconds_text(std::chrono::milliseconds ms) { return fmt::format("{:g} s", double(ms.count()) / 1000); }

// "generator G nvrtc N" -> {G, N}; nullopt for a tag of another form.
std::optional<std::pair<unsigned long long, std::string>> parse_version_tag(const std::string& tag) {
  const std::string g = "generator ", n = " nvrtc ";
  if (tag.compare(0, g.size(), g) != 0) return std::nullopt;
  const auto at = tag.find(n, g.size());
  if (at == std::string::npos || at == g.size() || at + n.size() == tag.size()) return std::nullopt;
  const std::string gen = tag.substr(g.size(), at - g.size());
  if (gen.size() > 18 || !std::all_of(gen.begin(), gen.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::make_pair(std::stoull(gen), tag.substr(at + n.size()));
}

// One file as list() reports it, with what prune() needs from the same read.
struct Listed {
  EntryInfo info;
  std::uint32_t format = 0;  // the entry's format version (0 when unreadable or not read)
  struct stat st {};         // what was read: prune removes the file only if it is still this one
};

// Every entry path (*.kdc, whatever file type) and every stale temporary file
// in dir, sorted by path. Each is lstat'ed once and each entry read (and its
// checksum computed) once.
std::vector<Listed> list_dir(const fs::path& dir, const PayloadCheck& check) {
  std::vector<Listed> out;
  for_each_file(dir, [&](const fs::path& path) {
    const std::string name = path.filename().string();
    Listed l;
    EntryInfo& info = l.info;
    info.path = path;
    bool stat_ok = false;
    std::string hash16;
    if (parse_entry_name(name, &info.readable, &hash16)) {
      Entry e = read_entry(info.path, nullptr, hash16, check);
      if (e.state == Entry::State::missing) return;  // removed while listing
      stat_ok = e.stat_ok;
      l.st = e.st;
      l.format = e.format;
      info.valid = e.state == Entry::State::ok;
      info.problem = e.problem;
      info.version = e.tag;
    } else {
      stat_ok = ::lstat(info.path.c_str(), &l.st) == 0;
      if (ends_with(name, kEntryExt)) {
        info.readable = name.substr(0, name.size() - std::strlen(kEntryExt));
        info.problem = "file name is not <readable>-<16 hex digits>.kdc";
      } else if (stat_ok && stale_temp(name, l.st)) {
        info.kind = EntryInfo::Kind::temp;
        info.readable = name;
        info.problem = "stale temporary file (unmodified for over an hour: its writer is gone)";
      } else {
        return;
      }
    }
    if (stat_ok) {
      info.bytes = S_ISREG(l.st.st_mode) ? std::uintmax_t(l.st.st_size) : 0;
      info.last_used = mtime_of(l.st);
    }
    out.push_back(std::move(l));
  });
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) { return a.info.path < b.info.path; });
  return out;
}

}  // namespace

DiskCache::DiskCache(fs::path dir, std::optional<std::chrono::milliseconds> lock_timeout,
                     std::optional<std::uint64_t> max_bytes)
    : DiskCache(std::move(dir), Options{lock_timeout, max_bytes, {}, false}) {}

DiskCache::DiskCache(fs::path dir, Options options)
    : dir_(std::move(dir)),
      lock_timeout_(options.lock_timeout ? *options.lock_timeout : lock_timeout_from_env()),
      max_bytes_(options.max_bytes ? *options.max_bytes : max_bytes_from_env()),
      payload_check_(std::move(options.payload_check)),
      inspect_only_(options.inspect_only) {
  require(lock_timeout_.count() >= 0, "cache: the lock timeout must be >= 0");
  if (inspect_only_) {  // list/verify/clear/prune store nothing: no probe, no warning
    memory_only_ = true;
    return;
  }
  if (dir_.empty()) {
    memory_only_ = true;
    std::fputs(
        "kdtree: warning: no cache directory (KDTREE_CACHE_DIR, XDG_CACHE_HOME and HOME are unset and "
        "the user has no home directory); caching in memory only\n",
        stderr);
    return;
  }
  if (std::string why = unusable_reason(dir_); !why.empty()) degrade(why);
}

DiskCache::~DiskCache() = default;

std::string DiskCache::unusable_reason(const fs::path& dir) {
  if (dir.empty()) return "no directory";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ec.message();
  if (!fs::is_directory(dir, ec)) return "not a directory";
  // Creating the directory can succeed (or be unnecessary) where files cannot
  // be written: probe with a real file.
  const fs::path probe = dir / (kProbeName + temp_suffix());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text(errno);
  ::close(fd);
  if (::unlink(probe.c_str()) != 0) return "cannot remove files: " + errno_text(errno);
  return "";
}

fs::path DiskCache::default_dir() {
  if (std::string d = env("KDTREE_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return fs::path(d) / "kdtree";
  std::string home = env("HOME");
  if (home.empty()) {
    std::string error;
    home = passwd_home(::getuid(), &error);
    if (!error.empty()) {
      const std::string msg = "kdtree: warning: cannot look up the home directory of uid " +
                              std::to_string(::getuid()) + ": " + error + "\n";
      std::fputs(msg.c_str(), stderr);
    }
  }
  if (home.empty()) return {};  // nowhere to put it: memory only (the constructor warns)
  return fs::path(home) / ".cache" / "kdtree";
}

std::chrono::milliseconds DiskCache::lock_timeout_from_env() {
  const std::string text = env("KDTREE_CACHE_LOCK_TIMEOUT");
  if (text.empty()) return kDefaultLockTimeout;
  // Decimal digits with at most one '.': strtod alone would also take hex
  // ("0x10"), exponents, "inf" and "nan".
  const bool decimal = std::count(text.begin(), text.end(), '.') <= 1 &&
                       std::any_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                       std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
  char* end = nullptr;
  errno = 0;
  const double seconds = decimal ? std::strtod(text.c_str(), &end) : 0;
  if (!decimal || errno != 0 || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 86400) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         "KDTREE_CACHE_LOCK_TIMEOUT='" + text + "' is not a number of seconds in 0..86400 (e.g. 30 or 0.5)");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

std::uint64_t DiskCache::max_bytes_from_env() {
  const std::string text = env("KDTREE_CACHE_MAX_BYTES");
  if (text.empty()) return kDefaultMaxBytes;
  auto bad = [&] {
    fail(KDTREE_ERROR_INVALID_ARGUMENT, "KDTREE_CACHE_MAX_BYTES='" + text +
                                            "' is not a size in bytes (an integer with an optional K, M, G or "
                                            "T suffix, e.g. 2G; 0 = unlimited)");
  };
  std::size_t i = 0;
  std::uint64_t value = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (UINT64_MAX - 9) / 10) bad();
    value = value * 10 + std::uint64_t(text[i] - '0');
  }
  if (i == 0) bad();
  int shift = 0;
  if (i < text.size()) {
    const char* suffixes = "KMGT";
    const char* at = std::strchr(suffixes, std::toupper(static_cast<unsigned char>(text[i])));
    if (at == nullptr || text[i] == '\0' || i + 1 != text.size()) bad();
    shift = 10 * int(at - suffixes + 1);
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) bad();
  return value << shift;
}

std::string DiskCache::sha256_hex(const std::string& data) { return to_hex(Sha256::hash(data)); }

void DiskCache::degrade(const std::string& why) {
  if (memory_only_.exchange(true)) return;
  const std::string msg =
      "kdtree: warning: cache directory " + dir_.string() + " is not writable (" + why + "); caching in memory only\n";
  std::fputs(msg.c_str(), stderr);
}

std::shared_ptr<DiskCache::Slot> DiskCache::slot(const std::string& key_hex) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto& s = memory_[key_hex];
  if (!s) s = std::make_shared<Slot>();
  return s;
}

std::vector<char> DiskCache::get_or_build(const std::string& readable, const std::string& key_material,
                                          const std::function<std::vector<char>()>& build, Outcome* outcome,
                                          const std::string& version, std::string* not_stored) {
  if (not_stored) not_stored->clear();
  require(!readable.empty() && readable.size() <= kMaxReadable && readable[0] != '.' &&
              readable.find_first_of(std::string("/\\\0", 3)) == std::string::npos,
          "cache: readable name '" + readable + "' is not a safe file name (1.." + std::to_string(kMaxReadable) +
              " characters, no '/', not starting with '.')");
  require(version.size() <= kMaxTag, "cache: version tag over " + std::to_string(kMaxTag) + " bytes");
  require(bool(build), "cache: no build function for " + readable);
  const Digest key = Sha256::hash(key_material);
  std::shared_ptr<Slot> s = slot(to_hex(key));
  std::lock_guard<std::mutex> guard(s->mutex);  // same key: one thread builds, the others wait
  if (s->ready) {
    if (outcome) *outcome = Outcome::memory_hit;
    return s->payload;
  }
  Outcome how = Outcome::built;
  std::string why_not_stored;
  s->payload = load_or_build(readable, key, build, &how, version, &why_not_stored);
  if (not_stored) *not_stored = std::move(why_not_stored);
  s->ready = true;
  if (outcome) *outcome = how;
  return s->payload;
}

std::vector<char> DiskCache::load_or_build(const std::string& readable, const Digest& key,
                                           const std::function<std::vector<char>()>& build, Outcome* outcome,
                                           const std::string& version, std::string* not_stored) {
  *outcome = Outcome::built;
  if (dir_.empty()) return build();
  const std::string name = readable + "-" + to_hex(key).substr(0, 16) + kEntryExt;
  const fs::path path = dir_ / name;
  auto hit = [&](Entry& e) {
    // The LRU stamp: mtime, not atime (noatime/relatime mounts). A read-only cache keeps its order.
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
    *outcome = Outcome::disk_hit;
    return std::move(e.payload);
  };
  auto entry_warning = [&](const std::string& why) {
    *not_stored = "cannot store cache entry " + path.string() + " (" + why + ")";
    const std::string msg = "kdtree: warning: " + *not_stored + "; this kernel is kept in memory only\n";
    std::fputs(msg.c_str(), stderr);
  };
  // A degraded cache still reads valid entries (e.g. a pre-warmed read-only dir).
  Entry found = read_entry(path, &key, "", payload_check_);
  if (found.state == Entry::State::ok) return hit(found);
  if (memory_only_) return build();

  FileLock lock;
  const fs::path lock_path = path.string() + kLockExt;
  auto on_wait = [&] {
    const std::string msg = "kdtree: waiting for another process to compile " + readable + " (lock " +
                            lock_path.string() + "); compiling it here after " + seconds_text(lock_timeout_) + "\n";
    std::fputs(msg.c_str(), stderr);
  };
  int err = 0;
  FileLock::Result locked = lock.acquire(lock_path, lock_timeout_, on_wait, &err);
  if (locked == FileLock::Result::failed && err == ENOENT) {  // the directory was removed under us: make it again
    std::error_code ec;
    fs::create_directories(dir_, ec);
    locked = lock.acquire(lock_path, lock_timeout_, on_wait, &err);
  }
  if (locked == FileLock::Result::failed) {
    if (err == EISDIR || err == ELOOP) {  // something odd at this key's lock path only
      entry_warning("its lock path " + lock_path.string() + " is not a regular file");
      return build();
    }
    if (err == ENOSPC || err == EDQUOT || err == EMFILE || err == ENFILE) {  // may pass: this entry only
      entry_warning("cannot create its lock " + lock_path.string() + ": " + errno_text(err));
      return build();
    }
    degrade("cannot create " + lock_path.string() + ": " + errno_text(err));
    return build();
  }
  if (locked == FileLock::Result::held) {
    // Another process may have published while we waited for the lock.
    found = read_entry(path, &key, "", payload_check_);
    if (found.state == Entry::State::ok) return hit(found);
  }
  // Holding the lock, or gave up waiting for a stuck holder (the message said
  // so): build here. Publishing without the lock is still atomic, and saves the
  // next process the wait.
  std::vector<char> payload = build();  // throws: the lock is released, nothing published
  if (kHeaderSize + version.size() + payload.size() > kMaxEntryBytes) return payload;  // could never be read back
  if (found.is_dir) ::rmdir(path.c_str());  // an empty directory goes; a full one is reported below
  // A failed store (rename, full disk) fails this entry only: the next may be stored.
  const std::string failed = publish(path, payload, key, version);
  if (!failed.empty()) {
    entry_warning(found.is_dir ? "a directory is in the way" : failed);
  } else if (locked == FileLock::Result::held) {
    evict(path);
  }
  return payload;
}

void DiskCache::evict(const fs::path& keep) {
  if (max_bytes_ == 0 || memory_only_) return;
  struct Candidate {
    fs::path path;
    struct stat st;
  };
  std::vector<Candidate> candidates;
  std::uint64_t total = 0;
  try {
    for_each_file(dir_, [&](const fs::path& path) {
      const std::string name = path.filename().string();
      Candidate c{path, {}};
      if (::lstat(c.path.c_str(), &c.st) != 0) return;
      // Stale temporary files are space the limit must see: they go here too.
      if (stale_temp(name, c.st)) {
        remove_temp(c.path);
        return;
      }
      std::string readable, hash16;
      if (!parse_entry_name(name, &readable, &hash16) || !S_ISREG(c.st.st_mode)) return;  // not ours to count
      // A file that cannot be an entry (a sparse 3 GB file, another header)
      // must not push valid entries out: it is removed as bad instead.
      if (!entry_header_problem(c.path, c.st).empty()) {
        if (c.path != keep) remove_entry_locked(c.path, c.st);
        return;
      }
      total += std::uint64_t(c.st.st_size);
      candidates.push_back(std::move(c));
    });
  } catch (const Error&) {
    return;  // an unreadable directory: nothing to evict from it
  }
  if (total <= max_bytes_) return;
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_pair(a.st.st_mtim.tv_sec, a.st.st_mtim.tv_nsec) <
           std::make_pair(b.st.st_mtim.tv_sec, b.st.st_mtim.tv_nsec);
  });
  for (const Candidate& c : candidates) {
    if (total <= max_bytes_) break;
    if (c.path == keep) continue;
    if (remove_entry_locked(c.path, c.st).empty()) total -= std::uint64_t(c.st.st_size);
  }
}

std::vector<EntryInfo> DiskCache::list() const {
  std::vector<EntryInfo> out;
  for (Listed& l : list_dir(dir_, payload_check_)) out.push_back(std::move(l.info));
  return out;
}

std::vector<EntryInfo> DiskCache::verify() {
  std::vector<EntryInfo> entries = list();
  for (EntryInfo& info : entries) {
    if (info.valid) continue;
    // Re-check right before removing: another process may have just replaced
    // the bad entry with a good one (publish renames over it).
    std::string readable, hash16;
    if (info.kind == EntryInfo::Kind::entry && parse_entry_name(info.path.filename().string(), &readable, &hash16)) {
      const Entry again = read_entry(info.path, nullptr, hash16, payload_check_);
      if (again.state == Entry::State::ok) {
        info.valid = true;
        info.problem.clear();
        info.version = again.tag;
        continue;
      }
      if (again.state == Entry::State::missing) {
        info.removed = true;  // gone already
        continue;
      }
    }
    info.remove_error = info.kind == EntryInfo::Kind::temp ? remove_temp(info.path) : remove_path(info.path);
    info.removed = info.remove_error.empty();
  }
  return entries;
}

std::vector<EntryInfo> DiskCache::clear() {
  std::vector<EntryInfo> out;
  for_each_file(dir_, [&](const fs::path& path) {
    const std::string name = path.filename().string();
    EntryInfo info;
    info.path = path;
    info.readable = name;
    struct stat st {};
    const bool stat_ok = ::lstat(info.path.c_str(), &st) == 0;
    if (stat_ok && S_ISREG(st.st_mode)) info.bytes = std::uintmax_t(st.st_size);
    if (ends_with(name, kEntryExt)) {
      std::string hash16;
      if (!parse_entry_name(name, &info.readable, &hash16)) info.readable = name;
      info.remove_error = remove_path(info.path);
    } else if (ends_with(name, std::string(kEntryExt) + kLockExt)) {
      info.kind = EntryInfo::Kind::lock;
      FileLock lock;
      int err = 0;
      if (lock.try_acquire(info.path, false, &err)) {
        const int err = lock.release();  // unlinks it as its holder would
        if (err != 0) info.remove_error = errno_text(err);
      } else if (::lstat(info.path.c_str(), &st) == 0 && (S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode))) {
        info.remove_error = remove_path(info.path);  // not a lock file at all
      } else {
        return;  // held by a live process (or gone): leave it
      }
    } else if (stat_ok && stale_temp(name, st)) {
      info.kind = EntryInfo::Kind::temp;
      info.remove_error = remove_temp(info.path);
    } else {
      return;
    }
    info.removed = info.remove_error.empty();
    out.push_back(std::move(info));
  });
  std::sort(out.begin(), out.end(), [](const EntryInfo& a, const EntryInfo& b) { return a.path < b.path; });
  return out;
}

std::vector<EntryInfo> DiskCache::prune(const std::string& current_version) {
  std::vector<EntryInfo> out;
  std::vector<Listed> listed = list_dir(dir_, payload_check_);
  // The newest generator stored per NVRTC version (the current one counts): a
  // second NVRTC on this machine keeps the entries it uses.
  std::map<std::string, unsigned long long> newest;
  auto note = [&](const std::string& tag) {
    if (auto v = parse_version_tag(tag)) newest[v->second] = std::max(newest[v->second], v->first);
  };
  note(current_version);
  for (const Listed& l : listed) {
    if (l.info.valid) note(l.info.version);
  }
  // What list_dir read decides; remove_entry_locked removes a file only if it is
  // still the one read (an entry republished since then stays).
  for (Listed& l : listed) {
    EntryInfo& info = l.info;
    if (info.kind != EntryInfo::Kind::entry) continue;
    bool old = false;
    if (info.valid && info.version != current_version) {
      const auto v = parse_version_tag(info.version);
      old = !v || v->first < newest[v->second];
    }
    // (An entry whose name does not parse was not read: format 0, kept.)
    if (!info.valid && l.format > 0 && l.format < kFormatVersion) old = true;
    if (!old) continue;
    info.remove_error = remove_entry_locked(info.path, l.st);
    info.removed = info.remove_error.empty();
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace kdtree::cache
