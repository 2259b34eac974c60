// kdtree-gen: pre-warms the cubin cache, prints generated sources, reports the
// toolchain and device, and manages the cache directory.
//
//   kdtree-gen warm  [--arch sm_120|sm_90|native] [grid options] [-j N] [--cache-dir DIR]
//   kdtree-gen emit  --op OP [--head H] [--width W] [--page P] [--dtype T] [-o FILE]
//   kdtree-gen info  [--cache-dir DIR]
//   kdtree-gen cache list|clear|verify [--cache-dir DIR]
//
// Exit status: 0 ok, 1 some kernel failed to compile / the cache had bad entries,
// 2 usage or setup error (the message starts with "kdtree-gen:").
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cache/disk_cache.hpp"
#include "codegen/arch.hpp"
#include "codegen/grid.hpp"
#include "codegen/ops.hpp"
#include "codegen/render.hpp"
#include "codegen/verify_attention.hpp"
#include "runtime/driver.hpp"
#include "base/error.hpp"
#include "runtime/runtime.hpp"

namespace fs = std::filesystem;
using namespace kdtree;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

fs::path cache_dir_or_default(const std::string& dir) {
  return dir.empty() ? cache::DiskCache::default_dir() : fs::path(dir);
}

// The arch to compile for and a runtime that does it. "native" (or no --arch on a
// machine with a GPU) binds device 0; otherwise the runtime is compile-only.
std::unique_ptr<Engine> make_runtime(const std::string& arch, const fs::path& dir) {
  std::string why;
  bool native = arch == "native";
  if (arch.empty()) native = driver::available(&why);
  if (native) {
    if (arch == "native" && !driver::available(&why)) {
      fail(KDTREE_ERROR_NO_DEVICE, fmt::format("--arch native needs a GPU: {}", why));
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
  bool no_tree_ops = false;
  bool no_attention = false;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  std::string cache_dir;
};

int run_warm(const WarmOptions& o) {
  fs::path dir = cache_dir_or_default(o.cache_dir);
  codegen::GridOptions grid;
  grid.heads = o.heads;
  grid.widths = o.widths;
  grid.page_sizes = o.pages;
  grid.dtypes.clear();
  for (const std::string& d : o.dtypes) grid.dtypes.push_back(codegen::parse_dtype(d));
  grid.tree_ops = !o.no_tree_ops;
  grid.attention = !o.no_attention;

  std::unique_ptr<Engine> rt = make_runtime(o.arch, dir);
  const codegen::Arch arch = rt->arch();
  // Validates every grid point before the first compile.
  const std::vector<codegen::GridItem> items = codegen::enumerate_grid(grid, arch);
  const int total = static_cast<int>(items.size());
  const unsigned threads = std::max(1u, std::min<unsigned>(o.jobs, static_cast<unsigned>(total)));
  const int width = static_cast<int>(std::to_string(total).size());
  fmt::print("warm: {} kernels for {} on {} thread{} (cache {})\n", total, arch.name(), threads,
             threads == 1 ? "" : "s", rt->cache().memory_only() ? "memory only" : dir.string());
  std::fflush(stdout);

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
      std::string error;
      try {
        auto module = rt->compile(item.make());
        if (module->outcome != cache::Outcome::built) result = Result::reused;
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
      fmt::print("[{:>{}}/{}] {} {} {:.1f} s\n", done, width, total, what, item.label, secs);
      std::fflush(stdout);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();

  for (const Failure& f : failures) {
    fmt::print(stderr, "kdtree-gen: {} failed: {}\n", f.label, f.message);
  }
  fmt::print("warm: {} kernels for {}: {} compiled, {} reused, {} failed in {:.1f} s (cache {})\n", total,
             arch.name(), compiled, reused, failures.size(), seconds_since(start),
             rt->cache().memory_only() ? "memory only" : dir.string());
  return failures.empty() ? 0 : 1;
}

// ------------------------------------------------------------------ emit

struct EmitOptions {
  std::string op = "verify_attention";
  std::string head = "mla576/512";
  int width = 64;
  int page = 64;
  std::string dtype = "bf16";
  std::string arch = "sm_120";
  std::string output;
};

codegen::KernelSource emit_source(const EmitOptions& o) {
  const codegen::Arch arch =
      o.arch == "native" ? make_runtime("native", fs::path())->arch() : codegen::parse_arch(o.arch);
  codegen::OpPoint point;
  point.head = o.head;
  point.width = o.width;
  point.page = o.page;
  point.dtype = codegen::parse_dtype(o.dtype);
  return codegen::find_operation(o.op).generate(point, arch);
}

int run_emit(const EmitOptions& o) {
  const codegen::KernelSource kernel = emit_source(o);
  const std::string source = codegen::flatten(kernel);  // one file, its headers inlined
  if (o.output.empty() || o.output == "-") {
    std::fwrite(source.data(), 1, source.size(), stdout);
    return 0;
  }
  std::ofstream out(o.output, std::ios::binary);
  out.write(source.data(), static_cast<std::streamsize>(source.size()));
  out.close();
  if (!out) fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("cannot write {}", o.output));
  fmt::print(stderr, "{}: {} bytes to {}\n", kernel.label, source.size(), o.output);
  return 0;
}

// ------------------------------------------------------------------ info and cache

std::string human_bytes(std::uintmax_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

void print_devices() {
  std::string why;
  if (!driver::available(&why)) {
    fmt::print("device:  no GPU: {}\n", why);
    return;
  }
  const driver::Api& api = driver::api();
  int version = 0, count = 0;
  driver::check(api.cuDriverGetVersion(&version), "cuDriverGetVersion");
  driver::check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  fmt::print("driver:  CUDA {}.{}\n", version / 1000, version % 1000 / 10);
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
    fmt::print("device {}: {}, sm_{}{}, {} SMs\n", i, name, major, minor, sms);
  }
}

int run_info(const std::string& cache_dir) {
  fmt::print("kdtree:  {}\n", KDTREE_VERSION_STRING);
  fmt::print("NVRTC:   {}\n", nvrtc_version());
  print_devices();
  const fs::path dir = cache_dir_or_default(cache_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fmt::print("cache:   {} (not created yet)\n", dir.string());
    return 0;
  }
  cache::DiskCache cache(dir);
  std::uintmax_t bytes = 0;
  size_t bad = 0;
  const auto entries = cache.list();
  for (const auto& e : entries) {
    bytes += e.bytes;
    bad += e.valid ? 0 : 1;
  }
  fmt::print("cache:   {}\n", dir.string());
  fmt::print("entries: {} ({}, {} bytes){}\n", entries.size(), human_bytes(bytes), bytes,
             bad ? fmt::format(", {} bad", bad) : std::string());
  return 0;
}

int run_cache(const std::string& action, const std::string& cache_dir) {
  const fs::path dir = cache_dir_or_default(cache_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    // Nothing to list, clear or verify; do not create the directory for it.
    fmt::print(action == "clear" ? "removed 0 entries from {}\n" : "cache {}: no entries\n", dir.string());
    return 0;
  }
  cache::DiskCache cache(dir);
  if (action == "clear") {
    fmt::print("removed {} entries from {}\n", cache.clear(), dir.string());
    return 0;
  }
  const bool verify = action == "verify";
  const auto entries = verify ? cache.verify() : cache.list();
  std::uintmax_t bytes = 0;
  size_t bad = 0;
  for (const auto& e : entries) {
    bytes += e.bytes;
    if (!e.valid) ++bad;
    fmt::print("{:<64} {:>10}  {}\n", e.readable, human_bytes(e.bytes),
               e.valid ? std::string("valid") : (verify ? "removed: " : "bad: ") + e.problem);
  }
  fmt::print("cache {}: {} entries, {}, {} bad{}\n", dir.string(), entries.size(), human_bytes(bytes), bad,
             verify && bad ? " (removed)" : "");
  return verify && bad ? 1 : 0;
}

void add_cache_dir(CLI::App* app, std::string& dir) {
  app->add_option("--cache-dir", dir, "Cache directory (default: $KDTREE_CACHE_DIR, else "
                                      "$XDG_CACHE_HOME/kdtree, else ~/.cache/kdtree)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdtree-gen: generate, compile and cache kdtree's CUDA kernels"};
  app.set_version_flag("--version", KDTREE_VERSION_STRING);
  app.require_subcommand(1);

  WarmOptions warm;
  CLI::App* warm_cmd = app.add_subcommand("warm", "Compile a grid of kernels into the cache");
  warm_cmd->add_option("--arch", warm.arch,
                       "sm_120, sm_90, sm_80, ... or native (default: native with a GPU, else sm_120)");
  warm_cmd->add_option("--heads", warm.heads, "Head shapes: mla576/512, gqa64, gqa128, gqa256")
      ->delimiter(',')
      ->capture_default_str();
  warm_cmd->add_option("--widths", warm.widths, "Tree widths W: 16, 32, 64, 128")
      ->delimiter(',')
      ->capture_default_str();
  warm_cmd->add_option("--pages", warm.pages, "Page sizes: 1, 16, 32, 64, 128")
      ->delimiter(',')
      ->capture_default_str();
  warm_cmd->add_option("--dtypes", warm.dtypes, "Attention dtypes: bf16, f16")
      ->delimiter(',')
      ->capture_default_str();
  warm_cmd->add_flag("--no-tree-ops", warm.no_tree_ops, "Only verify_attention kernels");
  warm_cmd->add_flag("--no-attention", warm.no_attention, "Only the tree operations");
  warm_cmd->add_option("-j,--jobs", warm.jobs, "Compile threads (default: hardware threads)")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  add_cache_dir(warm_cmd, warm.cache_dir);

  EmitOptions emit;
  CLI::App* emit_cmd = app.add_subcommand("emit", "Print the generated CUDA source of one kernel");
  emit_cmd->add_option("--op", emit.op, fmt::format("{}", fmt::join(codegen::operation_names(), ", ")))
      ->check(CLI::IsMember(codegen::operation_names()))
      ->capture_default_str();
  emit_cmd->add_option("--head", emit.head, "Head shape (verify_attention)")->capture_default_str();
  emit_cmd->add_option("--width", emit.width, "Tree width W")->capture_default_str();
  emit_cmd->add_option("--page", emit.page, "Page size (verify_attention, kv_compact)")->capture_default_str();
  emit_cmd->add_option("--dtype", emit.dtype, "bf16 or f16; sample_tokens: logits bf16 or f32")
      ->capture_default_str();
  emit_cmd->add_option("--arch", emit.arch, "Target arch: sm_120, sm_90, ... or native")->capture_default_str();
  emit_cmd->add_option("-o,--output", emit.output, "Write to FILE instead of stdout");

  std::string info_dir;
  CLI::App* info_cmd = app.add_subcommand("info", "Versions, device and cache");
  add_cache_dir(info_cmd, info_dir);

  std::string cache_dir;
  std::string cache_action;
  CLI::App* cache_cmd = app.add_subcommand("cache", "Manage the cubin cache");
  cache_cmd->require_subcommand(1);
  for (const char* action : {"list", "clear", "verify"}) {
    const char* help = action[0] == 'l'   ? "List entries: name, size, valid or the problem"
                       : action[0] == 'c' ? "Remove every entry"
                                          : "Check every entry; remove bad ones (exit 1 if any)";
    CLI::App* sub = cache_cmd->add_subcommand(action, help);
    add_cache_dir(sub, cache_dir);
    sub->callback([&cache_action, action] { cache_action = action; });
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "kdtree-gen: {}\nRun 'kdtree-gen --help' for usage.\n", e.what());
    return 2;
  }

  try {
    if (warm_cmd->parsed()) return run_warm(warm);
    if (emit_cmd->parsed()) return run_emit(emit);
    if (info_cmd->parsed()) return run_info(info_dir);
    if (cache_cmd->parsed()) return run_cache(cache_action, cache_dir);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kdtree-gen: {}\n", e.what());
    return 2;
  }
  return 2;
}
