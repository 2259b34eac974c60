// Helpers shared by the disk cache tests: temporary directories, stderr
// capture, entry files, counting build functions, scoped environment variables.
#pragma once
#include <doctest/doctest.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"
#include "tests/support/env_var.hpp"

namespace kdtree::cache::test {

namespace fs = std::filesystem;
using kdtree::cache::DiskCache;

// A fresh directory from mkdtemp, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kdtree-cache-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

// Redirects fd 2 into a temporary file until text() is called.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    file_ = std::tmpfile();
    saved_ = ::dup(2);
    ::dup2(::fileno(file_), 2);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

inline std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

inline std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// s with byte i XOR-ed with mask.
inline std::string flip(std::string s, std::size_t i, int mask) {
  REQUIRE(i < s.size());
  s.at(i) = char(s.at(i) ^ mask);
  return s;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const fs::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << content;
}

// The *.kdc files in dir.
inline std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".kdc") out.push_back(e.path());
  }
  return out;
}

inline std::size_t file_count(const fs::path& dir) {
  return std::size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

// Sets the file's mtime (an entry's last use, a temp file's age) to `ago` seconds before now.
inline void set_last_use(const fs::path& path, int ago) {
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= ago;
  times[1] = times[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}

// A temporary file name of kdtree's own pattern for the entry file `entry_name`.
inline std::string own_temp_name(const std::string& entry_name, long pid = 4000000) {
  return entry_name + ".tmp." + std::to_string(pid) + ".1a2b.0";
}

// The entry file of readable name `readable` and key material `key` in dir.
inline fs::path entry_path(const fs::path& dir, const std::string& readable, const std::string& key) {
  return dir / (readable + "-" + DiskCache::sha256_hex(key).substr(0, 16) + ".kdc");
}

// A build function that counts its calls.
struct Builder {
  std::string payload;
  std::atomic<int> calls{0};
  std::function<std::vector<char>()> fn() {
    return [this] {
      ++calls;
      return bytes(payload);
    };
  }
};

// Counts opens of the files in a directory, by file name (inotify: the kernel
// queues one event per open as it happens, so no timing is involved). A close
// is watched as well, only so that two opens of one file in a row are never
// merged into one event.
class OpenCounter {
 public:
  explicit OpenCounter(const fs::path& dir) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) {
      unavailable_ = "inotify_init1: " + std::string(std::strerror(errno));
      return;
    }
    REQUIRE(::inotify_add_watch(fd_, dir.c_str(), IN_OPEN | IN_CLOSE) >= 0);
  }
  // Why opens cannot be counted here (e.g. no inotify instance left); "" when they can.
  const std::string& unavailable() const { return unavailable_; }
  ~OpenCounter() {
    if (fd_ >= 0) ::close(fd_);
  }
  OpenCounter(const OpenCounter&) = delete;
  OpenCounter& operator=(const OpenCounter&) = delete;

  // The opens since the last call, by file name.
  std::map<std::string, int> take() {
    std::map<std::string, int> opens;
    REQUIRE(fd_ >= 0);
    alignas(inotify_event) char buf[64 * 1024];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof buf)) > 0;) {
      for (ssize_t at = 0; at < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + at);
        if ((ev->mask & IN_OPEN) && ev->len > 0) ++opens[ev->name];
        REQUIRE((ev->mask & IN_Q_OVERFLOW) == 0);
        at += ssize_t(sizeof(inotify_event) + ev->len);
      }
    }
    return opens;
  }

 private:
  int fd_ = -1;
  std::string unavailable_;
};

using kdtree::test::EnvVar;

// A child process that holds an exclusive flock on `path` (creating it) until
// this object is destroyed: a live lock holder of another process.
class LockHolder {
 public:
  explicit LockHolder(const fs::path& path) {
    int ready[2], stop[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(stop) == 0);
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(stop[1]);
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
      if (fd < 0 || ::flock(fd, LOCK_EX) != 0 || ::write(ready[1], "x", 1) != 1) std::_Exit(1);
      char c;
      while (::read(stop[0], &c, 1) < 0 && errno == EINTR) {
      }
      std::_Exit(0);
    }
    ::close(ready[1]);
    ::close(stop[0]);
    stop_ = stop[1];
    char c = 0;
    const bool locked = ::read(ready[0], &c, 1) == 1;
    ::close(ready[0]);
    REQUIRE_MESSAGE(locked, "the lock-holding child failed to lock ", path.string());
  }
  ~LockHolder() {
    ::close(stop_);
    ::waitpid(pid_, nullptr, 0);
  }
  LockHolder(const LockHolder&) = delete;
  LockHolder& operator=(const LockHolder&) = delete;

 private:
  pid_t pid_ = -1;
  int stop_ = -1;
};

// Runs fn in a child process without root's privileges (uid and gid 65534 when
// run as root, as CI is), so that permission checks apply. Returns what fn
// returned, or why the child failed. Paths fn uses must be reachable by that user.
inline std::string run_unprivileged(const std::function<std::string()>& fn) {
  int out[2];
  REQUIRE(::pipe(out) == 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(out[0]);
    const int null = ::open("/dev/null", O_WRONLY);  // the cache's warnings are expected here
    if (null >= 0) ::dup2(null, 2);
    std::string report;
    if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      report = "child: cannot drop privileges";
    } else {
      try {
        report = fn();
      } catch (const std::exception& e) {
        report = std::string("child threw: ") + e.what();
      }
    }
    const char* p = report.data();
    for (std::size_t n = report.size(); n > 0;) {
      const ssize_t w = ::write(out[1], p, n);
      if (w <= 0) break;
      p += w;
      n -= std::size_t(w);
    }
    std::_Exit(0);
  }
  ::close(out[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    report.append(buf, std::size_t(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return report;
}

}  // namespace kdtree::cache::test
