// What the examples need beyond kdtree: their own device buffers, events and a
// GPU check, through the CUDA Driver API linked directly (libcuda). kdtree itself
// is used only through its public headers, kdtree.h and kdtree.hpp.
#pragma once
#include <cuda.h>

#include <stdexcept>
#include <string>

namespace example {

// Throws std::runtime_error "<what>: <CUDA error name>" unless `result` is CUDA_SUCCESS.
inline void cu(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "CUDA_ERROR_UNKNOWN";
  cuGetErrorName(result, &name);
  throw std::runtime_error(std::string(what) + ": " + name);
}

// True when the driver initialises and reports a device; otherwise *why_not says why.
inline bool gpu_available(std::string* why_not) {
  CUresult r = cuInit(0);
  int count = 0;
  if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&count);
  if (r == CUDA_SUCCESS && count > 0) return true;
  const char* name = "no device";
  if (r != CUDA_SUCCESS) cuGetErrorName(r, &name);
  *why_not = std::string("the CUDA driver reports ") + name;
  return false;
}

}  // namespace example
