// kdtree::Engine, the runtime behind a kdtree_runtime handle: owns the disk cache,
// compiles kernels through NVRTC, loads them on its device and launches them. One
// per device; every method is thread-safe. (Not the public C++ API's
// kdtree::Runtime in kdtree.hpp, which wraps the C handle.)
#pragma once
#include <cuda.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"
#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"

namespace kdtree {

// What ptxas reported for one kernel (parsed from the NVRTC log, -Xptxas -v).
struct ResourceUsage {
  int registers = -1;
  int static_smem = 0;  // bytes
  int stack_bytes = 0;
  int spill_stores = 0;  // bytes
  int spill_loads = 0;   // bytes
};

struct CompiledModule {
  std::string label;
  std::vector<char> cubin;
  std::string ptxas_log;
  std::map<std::string, ResourceUsage> usage;  // by entry point
  cache::Outcome outcome = cache::Outcome::built;
  // Why it was compiled here but not stored in the disk cache because of its
  // own entry path (get_or_build's not_stored); "" otherwise.
  std::string not_stored;
};

// A loaded module on the runtime's device.
class Module {
 public:
  // The entry point's function, with its dynamic shared memory limit raised to
  // at least `dynamic_smem` bytes (set once per function).
  CUfunction function(const std::string& entry, int dynamic_smem = 0);
  const CompiledModule& compiled() const { return *compiled_; }
  // How its kernels are launched, as the generator decided with the source.
  const codegen::LaunchFacts& launch() const { return source_->launch; }

 private:
  friend class Engine;
  CUmodule module_ = nullptr;
  std::shared_ptr<const codegen::KernelSource> source_;
  std::shared_ptr<const CompiledModule> compiled_;
  std::mutex mutex_;
  std::map<std::string, std::pair<CUfunction, int>> functions_;
};

struct LaunchDims {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned dynamic_smem = 0;
  // The kernel may start while the stream's previous kernel finishes (programmatic
  // dependent launch, sm_90+ only): it must call kd_grid_dependency_wait before
  // reading what that kernel writes, in every CTA. Elsewhere an ordinary launch.
  bool overlap_previous = false;
  // > 1: CTAs run as thread-block clusters of this many along z (sm_90+; cuLaunchKernelEx).
  unsigned cluster_z = 1;
};

class Engine {
 public:
  // Bound to CUDA device `device`; the driver is loaded at first device use.
  Engine(int device, const std::string& cache_dir);
  // Compile-only runtime for an arch (no device, no driver).
  static std::unique_ptr<Engine> offline(int sm, const std::string& cache_dir);
  ~Engine();

  bool has_device() const { return device_ >= 0; }
  // Target arch and limits; for a device runtime this queries the device.
  const codegen::Arch& arch();
  cache::DiskCache& cache() { return *cache_; }

  // Compiles `source` for arch() or loads it from the cache. No device needed.
  std::shared_ptr<const CompiledModule> compile(const codegen::KernelSource& source);

  // The generated source (and launch facts) for `fast_key`, a cheap string naming
  // the op and its compile-time shape; `make` runs only on the first request, so
  // planning a launch and loading the module read one generation. No device needed.
  std::shared_ptr<const codegen::KernelSource> source(const std::string& fast_key,
                                                      const std::function<codegen::KernelSource()>& make);

  // The loaded module for `fast_key`, compiled from source(fast_key, make).
  Module& module(const std::string& fast_key, const std::function<codegen::KernelSource()>& make);

  // Launches on `stream` (no host synchronisation). Throws naming `what`.
  void launch(CUfunction fn, const LaunchDims& dims, void** args, CUstream stream, const char* what);

  // Whether LaunchDims::overlap_previous takes effect: sm_90+ with a driver that has
  // cuLaunchKernelEx, unless KDTREE_PDL=0 (loads the driver). Set with the arch, so
  // once it is known this is a lock-free read.
  bool programmatic_launch() {
    arch();
    return programmatic_launch_;
  }

  // Makes the runtime's context current on the calling thread (loads the driver).
  void make_current();

 private:
  Engine() = default;
  void ensure_device();

  int device_ = -1;
  std::unique_ptr<cache::DiskCache> cache_;
  codegen::Arch arch_;
  std::atomic<bool> arch_known_{false};
  bool programmatic_launch_ = false;  // LaunchDims::overlap_previous takes effect here
  CUdevice cu_device_ = 0;
  CUcontext context_ = nullptr;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const codegen::KernelSource>> sources_;
  std::map<std::string, std::unique_ptr<Module>> modules_;
  std::map<std::string, std::shared_ptr<std::mutex>> module_locks_;
};

// NVRTC version as "major.minor".
std::string nvrtc_version();
// The version tag cache entries are stored with ("generator G nvrtc N"): what
// `kdtree-gen cache prune` keeps.
std::string cache_version();
// Parses a ptxas -v log into per-kernel usage; a number that does not fit an
// int throws KDTREE_ERROR_COMPILE.
std::map<std::string, ResourceUsage> parse_ptxas_log(const std::string& log);
// "" when a cache payload unpacks (KDMD framing, an ELF cubin) and its log
// parses, else why not: the cache's payload check, so such an entry is bad
// (rebuilt, and reported and removed by `kdtree-gen cache verify`).
std::string cache_payload_problem(const std::vector<char>& payload);
// The cache options of the runtime's cache (its payload check); kdtree-gen's
// cache commands use them too, so they judge entries as the runtime does.
cache::DiskCache::Options cache_options();

}  // namespace kdtree
