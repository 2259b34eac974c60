#include "runtime/runtime.hpp"

#include <nvrtc.h>

#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/generator_version.hpp"
#include "runtime/driver.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace kdtree {
namespace {

// Cache payload: "KDMD" | u32 log bytes | log | cubin. The log keeps the ptxas
// resource report with the cubin, so a reused entry still reports spills.
constexpr char kPayloadMagic[4] = {'K', 'D', 'M', 'D'};

std::vector<char> pack(const NvrtcOutput& out) {
  std::vector<char> payload(8 + out.log.size() + out.cubin.size());
  uint32_t log_bytes = static_cast<uint32_t>(out.log.size());
  std::memcpy(payload.data(), kPayloadMagic, 4);
  std::memcpy(payload.data() + 4, &log_bytes, 4);
  std::memcpy(payload.data() + 8, out.log.data(), out.log.size());
  std::memcpy(payload.data() + 8 + out.log.size(), out.cubin.data(), out.cubin.size());
  return payload;
}

// Splits a payload into log and cubin: "" or why it is not one.
std::string split_payload(const std::vector<char>& payload, std::string* log, std::vector<char>* cubin) {
  uint32_t log_bytes = 0;
  if (payload.size() < 8 || std::memcmp(payload.data(), kPayloadMagic, 4) != 0) return "no KDMD header";
  std::memcpy(&log_bytes, payload.data() + 4, 4);
  if (payload.size() < 8 + size_t(log_bytes)) return fmt::format("log size {} past the end", log_bytes);
  // cuModuleLoadData takes an ELF image: anything else would fail at every load.
  const size_t cubin_at = 8 + size_t(log_bytes);
  if (payload.size() - cubin_at < 4 || std::memcmp(payload.data() + cubin_at,
                                                   "\x7f"
                                                   "ELF",
                                                   4) != 0) {
    return "the cubin is not an ELF image";
  }
  log->assign(payload.data() + 8, log_bytes);
  cubin->assign(payload.begin() + std::ptrdiff_t(cubin_at), payload.end());
  return "";
}

void unpack(const std::vector<char>& payload, CompiledModule* m) {
  if (std::string why = split_payload(payload, &m->ptxas_log, &m->cubin); !why.empty()) {
    fail(KDTREE_ERROR_CACHE, fmt::format("cache payload of {} is malformed: {}", m->label, why));
  }
}

// A ptxas number: digits that fit an int (the log is NVRTC's, or a cache
// entry's, so a bad one is an error, not std::stoi's out_of_range).
int ptxas_int(const std::string& digits, const std::string& line) {
  if (digits.size() > 9) fail(KDTREE_ERROR_COMPILE, fmt::format("ptxas report: number out of range in '{}'", line));
  return std::stoi(digits);
}

int attribute(CUdevice device, CUdevice_attribute a, const char* what) {
  int value = 0;
  driver::check(driver::api().cuDeviceGetAttribute(&value, a, device), what);
  return value;
}

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

std::string cache_payload_problem(const std::vector<char>& payload) {
  std::string log;
  std::vector<char> cubin;
  if (std::string why = split_payload(payload, &log, &cubin); !why.empty()) return why;
  try {
    parse_ptxas_log(log);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

cache::DiskCache::Options cache_options() {
  cache::DiskCache::Options o;
  o.payload_check = cache_payload_problem;
  return o;
}

std::string cache_version() { return fmt::format("generator {} nvrtc {}", KDTREE_GENERATOR_VERSION, nvrtc_version()); }

std::map<std::string, ResourceUsage> parse_ptxas_log(const std::string& log) {
  // ptxas info    : Compiling entry function 'kdtree_x' for 'sm_90'
  // ptxas info    : Function properties for kdtree_x
  //     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  // ptxas info    : Used 128 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
  std::map<std::string, ResourceUsage> usage;
  static const std::regex entry_re(R"(Compiling entry function '([^']+)')");
  static const std::regex props_re(R"(Function properties for ([A-Za-z_0-9]+))");
  static const std::regex frame_re(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex regs_re(R"(Used (\d+) registers)");
  static const std::regex smem_re(R"((\d+) bytes smem)");
  std::istringstream in(log);
  std::string line, current;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, entry_re) || std::regex_search(line, m, props_re)) {
      current = m[1];
      usage[current];
      continue;
    }
    if (current.empty()) continue;
    if (std::regex_search(line, m, frame_re)) {
      usage[current].stack_bytes = ptxas_int(m[1], line);
      usage[current].spill_stores = ptxas_int(m[2], line);
      usage[current].spill_loads = ptxas_int(m[3], line);
    }
    if (std::regex_search(line, m, regs_re)) usage[current].registers = ptxas_int(m[1], line);
    if (std::regex_search(line, m, smem_re)) usage[current].static_smem = ptxas_int(m[1], line);
  }
  return usage;
}

Engine::Engine(int device, const std::string& cache_dir) : device_(device) {
  require(device >= 0, "device must be >= 0 (got {})", device);
  cache_ = std::make_unique<cache::DiskCache>(
      cache_dir.empty() ? cache::DiskCache::default_dir() : std::filesystem::path(cache_dir), cache_options());
}

std::unique_ptr<Engine> Engine::offline(int sm, const std::string& cache_dir) {
  std::unique_ptr<Engine> rt(new Engine());
  rt->arch_ = codegen::arch_from_sm(sm);
  rt->arch_known_ = true;
  rt->cache_ = std::make_unique<cache::DiskCache>(
      cache_dir.empty() ? cache::DiskCache::default_dir() : std::filesystem::path(cache_dir), cache_options());
  return rt;
}

Engine::~Engine() {
  if (device_ < 0 || !context_) return;
  const auto& api = driver::api();
  for (auto& [key, module] : modules_) {
    if (module->module_) api.cuModuleUnload(module->module_);
  }
  api.cuDevicePrimaryCtxRelease(cu_device_);
}

void Engine::ensure_device() {
  if (device_ < 0) {
    fail(KDTREE_ERROR_NO_DEVICE, fmt::format("this runtime compiles for {} only and has no device", arch_.name()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (context_) return;
  const auto& api = driver::api();
  int count = 0;
  driver::check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (device_ >= count) {
    fail(KDTREE_ERROR_NO_DEVICE, fmt::format("CUDA device {} does not exist ({} device(s) present)", device_, count));
  }
  driver::check(api.cuDeviceGet(&cu_device_, device_), "cuDeviceGet");
  int major = attribute(cu_device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability");
  int minor = attribute(cu_device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability");
  codegen::Arch arch = codegen::arch_from_sm(major * 10 + minor);
  arch.max_smem_per_block =
      attribute(cu_device_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "shared memory per block");
  arch.max_smem_per_sm =
      attribute(cu_device_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "shared memory per SM");
  arch.num_sms = attribute(cu_device_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count");
  CUcontext ctx = nullptr;
  driver::check(api.cuDevicePrimaryCtxRetain(&ctx, cu_device_), "cuDevicePrimaryCtxRetain");
  arch_ = arch;
  // KDTREE_PDL=0 launches every kernel the ordinary way (a tuning and test override).
  const char* pdl = std::getenv("KDTREE_PDL");
  programmatic_launch_ = arch.sm >= 90 && api.cuLaunchKernelEx && !(pdl && std::string(pdl) == "0");
  arch_known_ = true;
  context_ = ctx;
}

const codegen::Arch& Engine::arch() {
  if (!arch_known_) ensure_device();
  return arch_;
}

void Engine::make_current() {
  ensure_device();
  const auto& api = driver::api();
  CUcontext current = nullptr;
  api.cuCtxGetCurrent(&current);
  if (current != context_) driver::check(api.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

std::shared_ptr<const CompiledModule> Engine::compile(const codegen::KernelSource& source) {
  const codegen::Arch& target = arch();
  std::vector<std::string> options = nvrtc_options(source, target);
  // The key covers everything NVRTC reads: the source and its named headers.
  std::string key_material =
      fmt::format("kdtree generator {}\nnvrtc {}\narch {}\noptions {}\n{}", KDTREE_GENERATOR_VERSION, nvrtc_version(),
                  target.name(), fmt::join(options, " "), source.source);
  for (const auto& [name, text] : source.headers) key_material += fmt::format("\n// header {}\n{}", name, text);
  auto module = std::make_shared<CompiledModule>();
  module->label = source.label;
  std::string readable = fmt::format("{}-{}", source.file_stem, target.name());
  std::vector<char> payload = cache_->get_or_build(
      readable, key_material, [&] { return pack(nvrtc_compile(source, target)); }, &module->outcome, cache_version(),
      &module->not_stored);
  unpack(payload, module.get());
  module->usage = parse_ptxas_log(module->ptxas_log);
  return module;
}

std::shared_ptr<const codegen::KernelSource> Engine::source(const std::string& fast_key,
                                                            const std::function<codegen::KernelSource()>& make) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sources_.find(fast_key);
    if (it != sources_.end()) return it->second;
  }
  // Rendering is cheap and deterministic: two threads racing here make equal
  // sources and the first one stored wins.
  auto made = std::make_shared<const codegen::KernelSource>(make());
  std::lock_guard<std::mutex> lock(mutex_);
  return sources_.emplace(fast_key, std::move(made)).first->second;
}

Module& Engine::module(const std::string& fast_key, const std::function<codegen::KernelSource()>& make) {
  std::shared_ptr<std::mutex> key_lock;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = modules_.find(fast_key);
    if (it != modules_.end()) return *it->second;
    auto& slot = module_locks_[fast_key];
    if (!slot) slot = std::make_shared<std::mutex>();
    key_lock = slot;
  }
  // One thread compiles and loads a key; others asking for it wait here.
  std::lock_guard<std::mutex> building(*key_lock);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = modules_.find(fast_key);
    if (it != modules_.end()) return *it->second;
  }
  // Generation validates (e.g. a tiles override) before the device is touched.
  auto loaded = std::make_unique<Module>();
  loaded->source_ = source(fast_key, make);
  make_current();
  loaded->compiled_ = compile(*loaded->source_);
  driver::check(driver::api().cuModuleLoadData(&loaded->module_, loaded->compiled_->cubin.data()),
                ("cuModuleLoadData(" + loaded->compiled_->label + ")").c_str());
  std::lock_guard<std::mutex> lock(mutex_);
  return *(modules_[fast_key] = std::move(loaded));
}

CUfunction Module::function(const std::string& entry, int dynamic_smem) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = functions_.find(entry);
  if (it == functions_.end()) {
    CUfunction fn = nullptr;
    driver::check(driver::api().cuModuleGetFunction(&fn, module_, entry.c_str()),
                  ("cuModuleGetFunction(" + entry + ")").c_str());
    it = functions_.emplace(entry, std::make_pair(fn, 0)).first;
  }
  if (dynamic_smem > it->second.second) {
    driver::check(driver::api().cuFuncSetAttribute(it->second.first, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   dynamic_smem),
                  ("raising the shared memory limit of " + entry).c_str());
    it->second.second = dynamic_smem;
  }
  return it->second.first;
}

void Engine::launch(CUfunction fn, const LaunchDims& d, void** args, CUstream stream, const char* what) {
  make_current();
  if (d.grid_x == 0 || d.grid_y == 0 || d.grid_z == 0) return;  // nothing to do
  const bool programmatic = d.overlap_previous && programmatic_launch_;
  if (programmatic || d.cluster_z > 1) {
    if (!driver::api().cuLaunchKernelEx) {
      fail(KDTREE_ERROR_DRIVER,
           fmt::format("{}: a cluster launch needs cuLaunchKernelEx, which this CUDA driver lacks", what));
    }
    CUlaunchAttribute attrs[2]{};
    unsigned n = 0;
    if (programmatic) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (d.cluster_z > 1) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim.x = 1;
      attrs[n].value.clusterDim.y = 1;
      attrs[n++].value.clusterDim.z = d.cluster_z;
    }
    CUlaunchConfig config{};
    config.gridDimX = d.grid_x;
    config.gridDimY = d.grid_y;
    config.gridDimZ = d.grid_z;
    config.blockDimX = d.block_x;
    config.blockDimY = d.block_y;
    config.blockDimZ = d.block_z;
    config.sharedMemBytes = d.dynamic_smem;
    config.hStream = stream;
    config.attrs = attrs;
    config.numAttrs = n;
    driver::check(driver::api().cuLaunchKernelEx(&config, fn, args, nullptr), what);
    return;
  }
  driver::check(driver::api().cuLaunchKernel(fn, d.grid_x, d.grid_y, d.grid_z, d.block_x, d.block_y, d.block_z,
                                             d.dynamic_smem, stream, args, nullptr),
                what);
}

}  // namespace kdtree
