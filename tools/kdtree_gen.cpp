// kdtree-gen: pre-warms the cubin cache, prints generated sources, reports the
// toolchain and device, and manages the cache directory.
//
//   kdtree-gen warm  [--arch sm_120|sm_90|native] [grid options] [-j N] [--cache-dir DIR] [--json]
//   kdtree-gen emit  --op OP [--head H] [--width W] [--page P] [--dtype T] [--kv-dtype K] [-o FILE]
//   kdtree-gen info  [--cache-dir DIR] [--json]
//   kdtree-gen cache list|clear|verify|prune [--cache-dir DIR] [--json (list)]
//
// NVRTC is the one the dynamic loader finds (RUNPATH: LD_LIBRARY_PATH first);
// `python -m kdtree` puts the package's NVRTC directory there. info prints the
// library's path.
//
// Exit status: 0 ok; 1 some kernel failed to compile or could not be stored, the
// cache had bad entries, or a file could not be removed; 2 usage or setup error
// (an unusable cache directory for warm; for info and cache, a cache path that
// is not a directory or cannot be read; a write error on stdout). Every error
// message is one line "kdtree-gen: <message>"; one about a flag's value starts
// with the flag: "kdtree-gen: --width: 48 is not supported (use 16, 32, 64 or 128)".
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <nvrtc.h>
#include <sys/stat.h>

#include "base/error.hpp"
#include "base/posix_io.hpp"
#include "cache/disk_cache.hpp"
#include "codegen/arch.hpp"
#include "codegen/grid.hpp"
#include "codegen/kv_compact.hpp"
#include "codegen/ops.hpp"
#include "codegen/render.hpp"
#include "codegen/sample_tokens.hpp"
#include "codegen/tree_accept.hpp"
#include "codegen/tree_build.hpp"
#include "codegen/tree_ops_common.hpp"
#include "codegen/verify_attention.hpp"
#include "runtime/driver.hpp"
#include "runtime/runtime.hpp"

namespace fs = std::filesystem;
using namespace kdtree;

namespace {

using Clock = std::chrono::steady_clock;

// A bad command line: printed with a pointer to --help, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

constexpr const char* kNoCacheDir =
    "no cache directory: KDTREE_CACHE_DIR, XDG_CACHE_HOME and HOME are unset and the user has no home directory "
    "(use --cache-dir DIR)";

fs::path cache_dir_or_default(const std::string& dir) {
  return dir.empty() ? cache::DiskCache::default_dir() : fs::path(dir);
}

// Whether the cache directory exists (false: no such directory). Anything else
// there (a file, /dev/null) or an error looking (no search permission) is an
// error: the cache commands must not report such a path as an empty cache.
bool cache_dir_exists(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    fail(KDTREE_ERROR_CACHE, fmt::format("cannot access the cache directory {}: {}", dir.string(), errno_text(errno)));
  }
  if (!S_ISDIR(st.st_mode))
    fail(KDTREE_ERROR_CACHE, fmt::format("cache directory {} is not a directory", dir.string()));
  return true;
}

// The cache as list/verify/clear/prune/info see it: entries judged as the
// runtime judges them, and no "memory only" warning (these store nothing).
std::unique_ptr<cache::DiskCache> inspect_cache(const fs::path& dir) {
  cache::DiskCache::Options options = cache_options();
  options.inspect_only = true;
  return std::make_unique<cache::DiskCache>(dir, options);
}

// The file NVRTC was loaded from, as the loader found it ("" if unknown): which
// of several NVRTCs on the machine this process uses.
std::string nvrtc_library() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// ------------------------------------------------------------------ JSON

std::string json(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}
std::string json(const fs::path& p) { return json(p.string()); }
std::string json(bool b) { return b ? "true" : "false"; }

// {"key": value, ...} from already-encoded values, in the order given.
std::string json_object(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = "{";
  for (const auto& [key, value] : fields) out += (out.size() > 1 ? ", " : "") + json(key) + ": " + value;
  return out + "}";
}

std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const std::string& item : items) out += (out.size() > 1 ? ", " : "") + item;
  return out + "]";
}

// ------------------------------------------------------------------ flag values

bool parse_int(const std::string& text, int* value) {
  try {
    std::size_t used = 0;
    *value = std::stoi(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

// Each returns "" for a good value, else why not (CLI11 prefixes the flag's name).
std::string check_width(const std::string& v) {
  int w = 0;
  if (!parse_int(v, &w)) return fmt::format("'{}' is not an integer", v);
  return codegen::is_supported_tree_width(w)
             ? ""
             : fmt::format("{} is not supported (use {})", w, codegen::supported_widths_text());
}

std::string check_page(const std::string& v) {
  int p = 0;
  if (!parse_int(v, &p)) return fmt::format("'{}' is not an integer", v);
  return codegen::is_supported_page_size(p)
             ? ""
             : fmt::format("{} is not supported (use {})", p, codegen::supported_page_sizes_text());
}

std::string check_head(const std::string& v) {
  try {
    int qk = 0, vd = 0;
    codegen::parse_head_name(v, &qk, &vd);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

std::string check_dtype(const std::string& v, std::initializer_list<const char*> allowed) {
  std::string names;
  for (const char* a : allowed) {
    if (v == a) return "";
    names += names.empty() ? a : std::string(" or ") + a;
  }
  return fmt::format("'{}' is not supported (use {})", v, names);
}

std::string check_kv_dtype(const std::string& v) {
  std::vector<const char*> names;
  for (kdtree_kv_dtype d : codegen::supported_kv_dtypes()) names.push_back(codegen::kv_dtype_name(d));
  std::string text;
  for (const char* n : names) {
    if (v == n) return "";
    text += text.empty() ? n : std::string(" or ") + n;
  }
  return fmt::format("'{}' is not supported (use {})", v, text);
}

std::string check_arch(const std::string& v) {
  if (v == "native") return "";
  try {
    codegen::parse_arch(v);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

std::string check_jobs(const std::string& v) {
  int j = 0;
  if (!parse_int(v, &j)) return fmt::format("'{}' is not an integer", v);
  return j >= 1 && j <= 1024 ? "" : fmt::format("{} is not in 1..1024", j);
}

// An empty element (--widths 16,,32, a leading or trailing comma) is an error
// naming the option: CLI11 drops empty elements when it splits at ','.
void check_list_elements(int argc, char** argv) {
  static const std::set<std::string> lists = {"--heads", "--widths", "--pages", "--dtypes", "--kv-dtypes"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], flag = arg, value;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (lists.count(arg) && i + 1 < argc) {
      value = argv[++i];
    } else {
      continue;  // no value here: CLI11 reports a missing one
    }
    if (!lists.count(flag)) continue;
    if (value.empty() || value.front() == ',' || value.back() == ',' || value.find(",,") != std::string::npos) {
      throw UsageError(fmt::format("{}: '{}' has an empty element (use a comma-separated list, e.g. {} {})", flag,
                                   value, flag,
                                   flag == "--widths"  ? "16,32"
                                   : flag == "--pages" ? "16,64"
                                                       : "a,b"));
    }
  }
}

// A list option (--heads a,b) takes one argument; a flag is never its value.
CLI::Option* list_option(CLI::Option* opt) {
  return opt->allow_extra_args(false)->delimiter(',')->check([](const std::string& v) {
    return !v.empty() && v[0] == '-' ? fmt::format("'{}' is not a value (the list is missing)", v) : std::string();
  });
}

void add_cache_dir(CLI::App* app, std::string& dir) {
  app->add_option("--cache-dir", dir,
                  "Cache directory (default: $KDTREE_CACHE_DIR, else $XDG_CACHE_HOME/kdtree, else ~/.cache/kdtree)")
      ->check([](const std::string& v) {
        return v.empty() ? std::string("must not be empty (leave the flag out for the default)") : std::string();
      });
}

// The arch to compile for and a runtime that does it. "native" (or no --arch on a
// machine with a GPU) binds device 0; otherwise the runtime is compile-only.
std::unique_ptr<Engine> make_runtime(const std::string& arch, const fs::path& dir) {
  std::string why;
  bool native = arch == "native";
  if (arch.empty()) native = driver::available(&why);
  if (native) {
    if (arch == "native" && !driver::available(&why)) {
      fail(KDTREE_ERROR_NO_DEVICE, fmt::format("--arch: native needs a GPU: {}", why));
    }
    auto rt = std::make_unique<Engine>(0, dir.string());
    rt->arch();  // query the device now, so a driver problem is reported before any work
    return rt;
  }
  return Engine::offline(codegen::parse_arch(arch.empty() ? "sm_120" : arch).sm, dir.string());
}

// ------------------------------------------------------------------ warm

struct WarmOptions {
  std::string arch;
  std::vector<std::string> heads{codegen::GridOptions{}.heads};
  std::vector<int> widths{codegen::GridOptions{}.widths};
  std::vector<int> pages{codegen::GridOptions{}.page_sizes};
  std::vector<std::string> dtypes{"bf16", "f16"};
  std::vector<std::string> kv_dtypes{[] {
    std::vector<std::string> names;
    for (kdtree_kv_dtype d : codegen::GridOptions{}.kv_dtypes) names.emplace_back(codegen::kv_dtype_name(d));
    return names;
  }()};
  bool no_tree_ops = false;
  bool no_attention = false;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  std::string cache_dir;
  bool json = false;
};

int run_warm(const WarmOptions& o) {
  // warm's job is to fill the cache: an unusable one is an error, not memory only.
  const fs::path dir = cache_dir_or_default(o.cache_dir);
  if (dir.empty()) fail(KDTREE_ERROR_CACHE, fmt::format("warm: {}", kNoCacheDir));
  if (std::string why = cache::DiskCache::unusable_reason(dir); !why.empty()) {
    fail(KDTREE_ERROR_CACHE, fmt::format("warm: cache directory {} is not usable ({})", dir.string(), why));
  }
  codegen::GridOptions grid;
  grid.heads = o.heads;
  grid.widths = o.widths;
  grid.page_sizes = o.pages;
  grid.dtypes.clear();
  for (const std::string& d : o.dtypes) grid.dtypes.push_back(codegen::parse_dtype(d));
  grid.kv_dtypes.clear();
  for (const std::string& d : o.kv_dtypes) grid.kv_dtypes.push_back(codegen::parse_kv_dtype(d));
  grid.tree_ops = !o.no_tree_ops;
  grid.attention = !o.no_attention;

  std::unique_ptr<Engine> rt = make_runtime(o.arch, dir);
  const codegen::Arch arch = rt->arch();
  // Validates every grid point before the first compile.
  const std::vector<codegen::GridItem> items = codegen::enumerate_grid(grid, arch);
  const int total = static_cast<int>(items.size());
  const unsigned threads = std::max(1u, std::min<unsigned>(o.jobs, static_cast<unsigned>(total)));
  const int width = static_cast<int>(std::to_string(total).size());
  // With --json, stdout holds only the summary object; progress goes to stderr.
  std::FILE* progress = o.json ? stderr : stdout;
  fmt::print(progress, "warm: {} kernels for {} on {} thread{} (cache {})\n", total, arch.name(), threads,
             threads == 1 ? "" : "s", dir.string());
  std::fflush(progress);

  struct Failure {
    std::string label, message;
  };
  std::mutex mutex;
  std::vector<Failure> failures;
  std::atomic<int> next{0};
  int done = 0, compiled = 0, reused = 0;
  const Clock::time_point start = Clock::now();

  auto worker = [&] {
    for (int i = next++; i < total; i = next++) {
      const codegen::GridItem& item = items[static_cast<size_t>(i)];
      const Clock::time_point t0 = Clock::now();
      enum class Result { compiled, reused, failed } result = Result::compiled;
      std::string error, tiles;
      try {
        const codegen::KernelSource source = item.make();
        tiles = source.launch.kernel;  // verify_attention: the family and tiles, as KDTREE_VERIFY_TILES spells them
        auto module = rt->compile(source);
        if (module->outcome != cache::Outcome::built) result = Result::reused;
        // Compiled, but warm's job is to store it: a blocked entry path is a failure.
        if (!module->not_stored.empty()) {
          result = Result::failed;
          error = "compiled, but " + module->not_stored;
        }
      } catch (const std::exception& e) {
        result = Result::failed;
        error = e.what();
      }
      const double secs = seconds_since(t0);
      std::lock_guard<std::mutex> lock(mutex);
      ++done;
      const char* what = "compiled";
      if (result == Result::compiled) {
        ++compiled;
      } else if (result == Result::reused) {
        ++reused;
        what = "reused  ";
      } else {
        failures.push_back({item.label, error});
        what = "FAILED  ";
      }
      fmt::print(progress, "[{:>{}}/{}] {} {} {:.1f} s{}\n", done, width, total, what, item.label, secs,
                 tiles.empty() ? "" : " (" + tiles + ")");
      std::fflush(progress);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();

  for (const Failure& f : failures) fmt::print(stderr, "kdtree-gen: {} failed: {}\n", f.label, f.message);
  // The directory can fail mid-run (disk full, removed permissions): the cache
  // warned once and kept going in memory, but nothing more was stored.
  const bool stored = !rt->cache().memory_only();
  if (!stored) fmt::print(stderr, "kdtree-gen: warm: the cache directory {} became unusable\n", dir.string());
  const double secs = seconds_since(start);
  if (o.json) {
    std::vector<std::string> failed;
    for (const Failure& f : failures)
      failed.push_back(json_object({{"kernel", json(f.label)}, {"error", json(f.message)}}));
    fmt::print("{}\n", json_object({{"arch", json(arch.name())},
                                    {"kernels", std::to_string(total)},
                                    {"compiled", std::to_string(compiled)},
                                    {"reused", std::to_string(reused)},
                                    {"failed", json_array(failed)},
                                    {"seconds", fmt::format("{:.3f}", secs)},
                                    {"cache", json(dir)},
                                    {"stored", json(stored)}}));
  } else {
    fmt::print("warm: {} kernels for {}: {} compiled, {} reused, {} failed in {:.1f} s (cache {})\n", total,
               arch.name(), compiled, reused, failures.size(), secs, stored ? dir.string() : "unusable");
  }
  return failures.empty() && stored ? 0 : 1;
}

// ------------------------------------------------------------------ emit

struct EmitOptions {
  std::string op = "verify_attention";
  std::string head = "mla576/512";
  int width = 64;
  int page = 64;
  std::string dtype = "bf16";
  std::string kv_dtype = "as_q";
  std::string arch = "sm_120";
  std::string output;
};

// The flags each op takes beyond --op, --arch and -o.
std::string check_op(const std::string& v) {
  const std::vector<std::string> names = codegen::operation_names();
  if (std::count(names.begin(), names.end(), v)) return "";
  return fmt::format("'{}' is not an op (use {})", v, fmt::join(names, ", "));
}

// A flag given that the op does not use is an error rather than silently ignored.
void check_emit_flags(const EmitOptions& o, CLI::App* emit_cmd) {
  const std::vector<std::string>& used = codegen::find_operation(o.op).axes;
  for (const char* flag : {"--head", "--width", "--page", "--dtype", "--kv-dtype"}) {
    if (emit_cmd->get_option(flag)->count() == 0 || std::count(used.begin(), used.end(), flag)) continue;
    std::string takes;
    for (const std::string& u : used) takes += (takes.empty() ? "" : ", ") + u;
    throw UsageError(fmt::format("{}: not used by --op {} (it takes {})", flag, o.op, takes));
  }
  if (o.op == "verify_attention") {
    if (std::string why = check_dtype(o.dtype, {"bf16", "f16"}); !why.empty()) throw UsageError("--dtype: " + why);
  } else if (o.op == "sample_tokens") {
    if (std::string why = check_dtype(o.dtype, {"bf16", "f32"}); !why.empty()) throw UsageError("--dtype: " + why);
  }
}

codegen::KernelSource emit_source(const EmitOptions& o) {
  const codegen::Arch arch =
      o.arch == "native" ? make_runtime("native", fs::path())->arch() : codegen::parse_arch(o.arch);
  codegen::OpPoint point;
  point.head = o.head;
  point.width = o.width;
  point.page = o.page;
  point.dtype = codegen::parse_dtype(o.dtype);
  point.kv_dtype = codegen::parse_kv_dtype(o.kv_dtype);
  return codegen::find_operation(o.op).generate(point, arch);
}

int run_emit(const EmitOptions& o) {
  const codegen::KernelSource kernel = emit_source(o);
  const std::string source = codegen::flatten(kernel);  // one file, its headers inlined
  if (o.output.empty() || o.output == "-") {
    if (std::fwrite(source.data(), 1, source.size(), stdout) != source.size()) {
      fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("cannot write to standard output: {}", errno_text(errno)));
    }
    return 0;  // main flushes and checks stdout
  }
  std::FILE* out = std::fopen(o.output.c_str(), "wb");
  if (!out)
    fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("--output: cannot open {}: {}", o.output, errno_text(errno)));
  const bool written = std::fwrite(source.data(), 1, source.size(), out) == source.size();
  int err = written ? 0 : errno;
  if (std::fclose(out) != 0 && err == 0) err = errno;
  if (!written || err != 0) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         fmt::format("--output: cannot write {}: {}", o.output, err ? errno_text(err) : "short write"));
  }
  fmt::print(stderr, "{}{}: {} bytes to {}\n", kernel.label,
             kernel.launch.kernel.empty() ? "" : " (" + kernel.launch.kernel + ")", source.size(), o.output);
  return 0;
}

// ------------------------------------------------------------------ info and cache

std::string human_bytes(std::uintmax_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  if (bytes < (std::uintmax_t(1) << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
}

struct DeviceReport {
  std::string no_gpu;  // why there is none ("" = a driver is present)
  std::string driver;  // "13.0"
  struct Device {
    std::string name, sm;
    int sms = 0;
  };
  std::vector<Device> devices;
};

DeviceReport devices() {
  DeviceReport r;
  if (!driver::available(&r.no_gpu)) return r;
  r.no_gpu.clear();
  const driver::Api& api = driver::api();
  int version = 0, count = 0;
  driver::check(api.cuDriverGetVersion(&version), "cuDriverGetVersion");
  driver::check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  r.driver = fmt::format("{}.{}", version / 1000, version % 1000 / 10);
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    driver::check(api.cuDeviceGet(&dev, i), "cuDeviceGet");
    char name[256] = {};
    int major = 0, minor = 0, sms = 0;
    driver::check(api.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
    driver::check(api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                  "cuDeviceGetAttribute");
    driver::check(api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                  "cuDeviceGetAttribute");
    driver::check(api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                  "cuDeviceGetAttribute");
    r.devices.push_back({name, fmt::format("sm_{}{}", major, minor), sms});
  }
  return r;
}

struct Totals {
  std::size_t files = 0, bad = 0;
  std::uintmax_t bytes = 0;
};

Totals totals(const std::vector<cache::EntryInfo>& entries) {
  Totals t;
  for (const cache::EntryInfo& e : entries) {
    ++t.files;
    t.bytes += e.bytes;
    t.bad += e.valid ? 0 : 1;
  }
  return t;
}

std::string kind_name(cache::EntryInfo::Kind k) {
  return k == cache::EntryInfo::Kind::entry ? "entry" : k == cache::EntryInfo::Kind::temp ? "temp" : "lock";
}

std::string entry_json(const cache::EntryInfo& e) {
  const double last_used = std::chrono::duration<double>(e.last_used.time_since_epoch()).count();
  return json_object({{"name", json(e.readable)},
                      {"file", json(e.path)},
                      {"kind", json(kind_name(e.kind))},
                      {"bytes", std::to_string(e.bytes)},
                      {"valid", json(e.valid)},
                      {"problem", json(e.problem)},
                      {"version", json(e.version)},
                      {"last_used", fmt::format("{:.3f}", last_used)}});
}

int run_info(const std::string& cache_dir, bool as_json) {
  const DeviceReport dev = devices();
  const fs::path dir = cache_dir_or_default(cache_dir);
  const bool exists = !dir.empty() && cache_dir_exists(dir);
  Totals t;
  // What DiskCache(dir) itself reads.
  const std::uint64_t max_bytes = cache::DiskCache::max_bytes_from_env();
  const std::chrono::milliseconds lock_timeout = cache::DiskCache::lock_timeout_from_env();
  if (exists) t = totals(inspect_cache(dir)->list());
  if (as_json) {
    std::vector<std::string> devs;
    for (const auto& d : dev.devices) {
      devs.push_back(json_object({{"name", json(d.name)}, {"arch", json(d.sm)}, {"sms", std::to_string(d.sms)}}));
    }
    fmt::print("{}\n",
               json_object(
                   {{"kdtree", json(std::string(KDTREE_VERSION_STRING))},
                    {"nvrtc", json(nvrtc_version())},
                    {"nvrtc_library", json(nvrtc_library())},
                    {"cache_version", json(cache_version())},
                    {"driver", dev.no_gpu.empty() ? json(dev.driver) : "null"},
                    {"no_gpu", dev.no_gpu.empty() ? "null" : json(dev.no_gpu)},
                    {"devices", json_array(devs)},
                    {"supported", codegen::supported_shapes_json()},
                    {"cache", json_object({{"dir", dir.empty() ? "null" : json(dir)},
                                           {"exists", json(exists)},
                                           {"files", std::to_string(t.files)},
                                           {"bytes", std::to_string(t.bytes)},
                                           {"bad", std::to_string(t.bad)},
                                           {"max_bytes", std::to_string(max_bytes)},
                                           {"lock_timeout_s", fmt::format("{:g}", lock_timeout.count() / 1000.0)}})}}));
    return 0;
  }
  fmt::print("kdtree:  {}\n", KDTREE_VERSION_STRING);
  const std::string nvrtc_file = nvrtc_library();
  fmt::print("NVRTC:   {}{}\n", nvrtc_version(), nvrtc_file.empty() ? "" : " (" + nvrtc_file + ")");
  if (!dev.no_gpu.empty()) {
    fmt::print("device:  no GPU: {}\n", dev.no_gpu);
  } else {
    fmt::print("driver:  CUDA {}\n", dev.driver);
    for (std::size_t i = 0; i < dev.devices.size(); ++i) {
      fmt::print("device {}: {}, {}, {} SMs\n", i, dev.devices[i].name, dev.devices[i].sm, dev.devices[i].sms);
    }
  }
  if (dir.empty()) {
    fmt::print("cache:   none ({})\n", kNoCacheDir);
    return 0;
  }
  fmt::print("cache:   {}{}\n", dir.string(), exists ? "" : " (not created yet)");
  fmt::print("limit:   {} (KDTREE_CACHE_MAX_BYTES), lock wait {:g} s (KDTREE_CACHE_LOCK_TIMEOUT)\n",
             max_bytes ? human_bytes(max_bytes) : "none", lock_timeout.count() / 1000.0);
  if (exists) {
    fmt::print("entries: {} ({}, {} bytes){}\n", t.files, human_bytes(t.bytes), t.bytes,
               t.bad ? fmt::format(", {} bad", t.bad) : std::string());
  }
  return 0;
}

// Prints what clear/verify/prune could not remove; returns how many.
std::size_t report_not_removed(const std::vector<cache::EntryInfo>& entries) {
  std::size_t kept = 0;
  for (const cache::EntryInfo& e : entries) {
    if (e.removed) continue;  // each was tried: valid ones too (prune removes valid entries of other versions)
    ++kept;
    fmt::print(stderr, "kdtree-gen: cannot remove {}: {}\n", e.path.string(), e.remove_error);
  }
  return kept;
}

int run_cache(const std::string& action, const std::string& cache_dir, bool as_json) {
  const fs::path dir = cache_dir_or_default(cache_dir);
  if (dir.empty()) fail(KDTREE_ERROR_CACHE, fmt::format("cache {}: {}", action, kNoCacheDir));
  if (!cache_dir_exists(dir)) {
    // Nothing to list, clear, verify or prune; do not create the directory for it.
    if (as_json) {
      fmt::print("{}\n", json_object({{"dir", json(dir)}, {"entries", "[]"}, {"bytes", "0"}, {"bad", "0"}}));
    } else {
      fmt::print("cache {}: no entries (no such directory)\n", dir.string());
    }
    return 0;
  }
  const std::unique_ptr<cache::DiskCache> opened = inspect_cache(dir);
  cache::DiskCache& cache = *opened;
  if (action == "clear" || action == "prune") {
    const auto tried = action == "clear" ? cache.clear() : cache.prune(cache_version());
    const std::size_t kept = report_not_removed(tried);
    fmt::print(
        "removed {} of {} files from {}{}\n", tried.size() - kept, tried.size(), dir.string(),
        action == "prune" ? fmt::format(" (older than {}, or than the newest of their NVRTC)", cache_version()) : "");
    return kept ? 1 : 0;
  }
  const bool verify = action == "verify";
  const auto entries = verify ? cache.verify() : cache.list();
  const Totals t = totals(entries);
  if (as_json) {
    std::vector<std::string> items;
    for (const auto& e : entries) items.push_back(entry_json(e));
    fmt::print("{}\n", json_object({{"dir", json(dir)},
                                    {"entries", json_array(items)},
                                    {"bytes", std::to_string(t.bytes)},
                                    {"bad", std::to_string(t.bad)},
                                    {"max_bytes", std::to_string(cache.max_bytes())}}));
    return 0;
  }
  std::size_t kept = 0;
  for (const auto& e : entries) {
    std::string state = "valid";
    if (!e.valid && !verify) state = "bad: " + e.problem;
    if (!e.valid && verify && e.removed) state = "removed: " + e.problem;
    if (!e.valid && verify && !e.removed) {
      state = fmt::format("NOT removed ({}): {}", e.remove_error, e.problem);
      ++kept;
    }
    fmt::print("{:<64} {:>10}  {}\n", e.readable, human_bytes(e.bytes), state);
  }
  fmt::print("cache {}: {} files, {}, {} bad{}\n", dir.string(), t.files, human_bytes(t.bytes), t.bad,
             verify && t.bad ? fmt::format(" ({} removed, {} could not be)", t.bad - kept, kept) : "");
  return verify && t.bad ? 1 : 0;
}

// A word where a subcommand belongs that is none: CLI11 would only say that
// "a subcommand is required".
void check_subcommand(int argc, char** argv) {
  static const std::set<std::string> top = {"warm", "emit", "info", "cache"};
  static const std::set<std::string> actions = {"list", "clear", "verify", "prune"};
  if (argc > 1 && argv[1][0] != '-' && !top.count(argv[1])) {
    throw UsageError(fmt::format("unknown subcommand '{}' (use warm, emit, info or cache)", argv[1]));
  }
  if (argc > 2 && std::string(argv[1]) == "cache" && argv[2][0] != '-' && !actions.count(argv[2])) {
    throw UsageError(fmt::format("cache: unknown action '{}' (use list, clear, verify or prune)", argv[2]));
  }
}

// stdout is checked once at the end: a full disk or closed pipe must not exit 0.
int finish(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout)) return status;
  fmt::print(stderr, "kdtree-gen: cannot write to standard output: {}\n", err ? errno_text(err) : "write error");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdtree-gen: generate, compile and cache kdtree's CUDA kernels"};
  app.set_version_flag("--version", KDTREE_VERSION_STRING);
  app.require_subcommand(1);
  app.footer(
      "Environment: KDTREE_CACHE_DIR (cache directory), KDTREE_CACHE_MAX_BYTES (size limit, LRU eviction; "
      "K/M/G/T suffix, 0 = none; default 2G), KDTREE_CACHE_LOCK_TIMEOUT (seconds to wait for another process "
      "compiling the same kernel before compiling it here; decimal, default 60).\n"
      "Exit status: 0 ok, 1 failures (kernels, bad entries, files not removed), 2 usage or setup error.\n");

  WarmOptions warm;
  CLI::App* warm_cmd = app.add_subcommand("warm",
                                          "Compile a grid of kernels into the cache (fails if the cache "
                                          "directory is unusable)");
  warm_cmd
      ->add_option("--arch", warm.arch, "sm_120, sm_90, sm_80, ... or native (default: native with a GPU, else sm_120)")
      ->check(check_arch);
  list_option(warm_cmd->add_option("--heads", warm.heads, "Head shapes: mla576/512, gqa64, gqa128, gqa256"))
      ->check(check_head)
      ->capture_default_str();
  list_option(warm_cmd->add_option("--widths", warm.widths, "Tree widths W: 16, 32, 64, 128"))
      ->check(check_width)
      ->capture_default_str();
  list_option(warm_cmd->add_option("--pages", warm.pages,
                                   fmt::format("Page sizes: {}", fmt::join(codegen::supported_page_sizes(), ", "))))
      ->check(check_page)
      ->capture_default_str();
  list_option(warm_cmd->add_option("--dtypes", warm.dtypes, "Attention dtypes: bf16, f16"))
      ->check([](const std::string& v) {
        return check_dtype(v, {"bf16", "f16"});
      })
      ->capture_default_str();
  list_option(warm_cmd->add_option("--kv-dtypes", warm.kv_dtypes,
                                   "verify_attention KV cache dtypes: as_q (the 16-bit dtype of q), e4m3 (fp8 "
                                   "caches with k_scale/v_scale); both by default"))
      ->check(check_kv_dtype)
      ->capture_default_str();
  warm_cmd->add_flag("--no-tree-ops", warm.no_tree_ops, "Only verify_attention kernels");
  warm_cmd->add_flag("--no-attention", warm.no_attention, "Only the tree operations");
  warm_cmd->add_option("-j,--jobs", warm.jobs, "Compile threads, 1..1024 (default: hardware threads)")
      ->check(check_jobs)
      ->capture_default_str();
  add_cache_dir(warm_cmd, warm.cache_dir);
  warm_cmd->add_flag("--json", warm.json, "Print the summary as one JSON object (progress goes to stderr)");

  EmitOptions emit;
  CLI::App* emit_cmd = app.add_subcommand("emit", "Print the generated CUDA source of one kernel");
  emit_cmd->add_option("--op", emit.op, fmt::format("{}", fmt::join(codegen::operation_names(), ", ")))
      ->check(check_op)
      ->capture_default_str();
  emit_cmd->add_option("--head", emit.head, "Head shape (verify_attention)")->check(check_head)->capture_default_str();
  emit_cmd->add_option("--width", emit.width, "Tree width W: 16, 32, 64, 128 (all but sample_tokens)")
      ->check(check_width)
      ->capture_default_str();
  emit_cmd
      ->add_option(
          "--page", emit.page,
          fmt::format("Page size: {} (verify_attention, kv_compact)", fmt::join(codegen::supported_page_sizes(), ", ")))
      ->check(check_page)
      ->capture_default_str();
  emit_cmd->add_option("--dtype", emit.dtype, "verify_attention: bf16 or f16; sample_tokens: logits bf16 or f32")
      ->capture_default_str();
  emit_cmd->add_option("--kv-dtype", emit.kv_dtype, "verify_attention: KV cache dtype as_q or e4m3")
      ->check(check_kv_dtype)
      ->capture_default_str();
  emit_cmd->add_option("--arch", emit.arch, "Target arch: sm_120, sm_90, ... or native")
      ->check(check_arch)
      ->capture_default_str();
  emit_cmd->add_option("-o,--output", emit.output, "Write to FILE instead of stdout");

  std::string info_dir;
  bool info_json = false;
  CLI::App* info_cmd = app.add_subcommand("info", "Versions, device, cache directory, entries and limits");
  add_cache_dir(info_cmd, info_dir);
  info_cmd->add_flag("--json", info_json, "Print one JSON object");

  std::string cache_dir;
  std::string cache_action;
  bool cache_json = false;
  CLI::App* cache_cmd = app.add_subcommand("cache", "Manage the cubin cache");
  cache_cmd->require_subcommand(1);
  const std::pair<const char*, const char*> actions[] = {
      {"list", "List entries and stale temporary files: name, size, valid or the problem"},
      {"clear", "Remove every entry, stale temporary file and unheld lock (exit 1 if one cannot be removed)"},
      {"verify", "Check every entry; remove bad ones and stale temporary files (exit 1 if any were bad)"},
      {"prune",
       "Remove entries of older formats and generators; entries of another NVRTC version are kept if they are the "
       "newest generator's for that NVRTC (another NVRTC on this machine may use them). Exit 1 if one cannot be "
       "removed (permission, or its lock is held)"},
  };
  for (const auto& [action, help] : actions) {
    CLI::App* sub = cache_cmd->add_subcommand(action, help);
    add_cache_dir(sub, cache_dir);
    if (std::string(action) == "list") sub->add_flag("--json", cache_json, "Print one JSON object");
    const std::string name = action;
    sub->callback([&cache_action, name] { cache_action = name; });
  }

  try {
    check_subcommand(argc, argv);
    check_list_elements(argc, argv);
    app.parse(argc, argv);
    if (emit_cmd->parsed()) check_emit_flags(emit, emit_cmd);
  } catch (const CLI::CallForHelp& e) {
    return finish(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return finish(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return finish(app.exit(e));
  } catch (const std::exception& e) {  // CLI::ParseError or UsageError
    fmt::print(stderr, "kdtree-gen: {}\nRun 'kdtree-gen --help' for usage.\n", e.what());
    return 2;
  }

  try {
    int status = 2;
    if (warm_cmd->parsed()) status = run_warm(warm);
    if (emit_cmd->parsed()) status = run_emit(emit);
    if (info_cmd->parsed()) status = run_info(info_dir, info_json);
    if (cache_cmd->parsed()) status = run_cache(cache_action, cache_dir, cache_json);
    return finish(status);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kdtree-gen: {}\n", e.what());
    return 2;
  }
}
