#include "runtime/driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include <fmt/format.h>

#include "base/error.hpp"

namespace kdtree::driver {
namespace {

Api g_api{};
std::string g_load_error;
std::once_flag g_once;

template <typename Fn>
bool bind(void* lib, Fn*& slot, const char* symbol) {
  slot = reinterpret_cast<Fn*>(dlsym(lib, symbol));
  if (!slot) g_load_error = fmt::format("libcuda.so.1 has no symbol {}", symbol);
  return slot != nullptr;
}

void load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    g_load_error = fmt::format("the CUDA driver (libcuda.so.1) could not be loaded: {}", why ? why : "unknown reason");
    return;
  }
  Api a{};
  // Versioned names: the ABI that cuda.h's macros select for CUDA >= 12.
  bool ok =
      bind(lib, a.cuInit, "cuInit") && bind(lib, a.cuDriverGetVersion, "cuDriverGetVersion") &&
      bind(lib, a.cuDeviceGetCount, "cuDeviceGetCount") && bind(lib, a.cuDeviceGet, "cuDeviceGet") &&
      bind(lib, a.cuDeviceGetAttribute, "cuDeviceGetAttribute") && bind(lib, a.cuDeviceGetName, "cuDeviceGetName") &&
      bind(lib, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
      bind(lib, a.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
      bind(lib, a.cuCtxSetCurrent, "cuCtxSetCurrent") && bind(lib, a.cuCtxGetCurrent, "cuCtxGetCurrent") &&
      bind(lib, a.cuCtxSynchronize, "cuCtxSynchronize") && bind(lib, a.cuModuleLoadData, "cuModuleLoadData") &&
      bind(lib, a.cuModuleUnload, "cuModuleUnload") && bind(lib, a.cuModuleGetFunction, "cuModuleGetFunction") &&
      bind(lib, a.cuFuncSetAttribute, "cuFuncSetAttribute") && bind(lib, a.cuFuncGetAttribute, "cuFuncGetAttribute") &&
      bind(lib, a.cuLaunchKernel, "cuLaunchKernel") && bind(lib, a.cuGetErrorName, "cuGetErrorName") &&
      bind(lib, a.cuGetErrorString, "cuGetErrorString") && bind(lib, a.cuMemAlloc, "cuMemAlloc_v2") &&
      bind(lib, a.cuMemFree, "cuMemFree_v2") && bind(lib, a.cuMemcpyHtoD, "cuMemcpyHtoD_v2") &&
      bind(lib, a.cuMemcpyDtoH, "cuMemcpyDtoH_v2") && bind(lib, a.cuMemcpyDtoD, "cuMemcpyDtoD_v2") &&
      bind(lib, a.cuMemsetD8, "cuMemsetD8_v2") && bind(lib, a.cuMemsetD32, "cuMemsetD32_v2") &&
      bind(lib, a.cuStreamCreate, "cuStreamCreate") && bind(lib, a.cuStreamDestroy, "cuStreamDestroy_v2") &&
      bind(lib, a.cuStreamSynchronize, "cuStreamSynchronize") && bind(lib, a.cuEventCreate, "cuEventCreate") &&
      bind(lib, a.cuEventDestroy, "cuEventDestroy_v2") && bind(lib, a.cuEventRecord, "cuEventRecord") &&
      bind(lib, a.cuEventSynchronize, "cuEventSynchronize") &&
      bind(lib, a.cuEventElapsedTime, "cuEventElapsedTime_v2") &&
      bind(lib, a.cuStreamBeginCapture, "cuStreamBeginCapture_v2") &&
      bind(lib, a.cuStreamEndCapture, "cuStreamEndCapture") &&
      bind(lib, a.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags") &&
      bind(lib, a.cuGraphLaunch, "cuGraphLaunch") && bind(lib, a.cuGraphExecDestroy, "cuGraphExecDestroy") &&
      bind(lib, a.cuGraphDestroy, "cuGraphDestroy");
  if (!ok) return;
  a.cuLaunchKernelEx = reinterpret_cast<decltype(a.cuLaunchKernelEx)>(dlsym(lib, "cuLaunchKernelEx"));
  a.cuTensorMapEncodeTiled = reinterpret_cast<decltype(a.cuTensorMapEncodeTiled)>(dlsym(lib, "cuTensorMapEncodeTiled"));
  CUresult r = a.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = "?";
    a.cuGetErrorName(r, &name);
    g_load_error = fmt::format("cuInit failed: {} (no usable GPU or driver)", name);
    return;
  }
  g_api = a;
}

}  // namespace

const Api& api() {
  std::call_once(g_once, load);
  if (!g_api.cuInit) fail(KDTREE_ERROR_NO_DRIVER, g_load_error);
  return g_api;
}

bool available(std::string* why_not) {
  try {
    int count = 0;
    check(api().cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count > 0) return true;
    if (why_not) *why_not = "the CUDA driver reports no device";
  } catch (const Error& e) {
    if (why_not) *why_not = e.what();
  }
  return false;
}

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "";
  if (g_api.cuGetErrorName) g_api.cuGetErrorName(result, &name);
  if (g_api.cuGetErrorString) g_api.cuGetErrorString(result, &text);
  fail(KDTREE_ERROR_DRIVER, fmt::format("{}: {}: {}", what, name, text ? text : ""));
}

}  // namespace kdtree::driver
