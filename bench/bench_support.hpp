// Helpers shared by the benchmarks that time kdtree through the C ABI: checks
// that exit on failure, device buffers, CUDA-event timing (driver table) and
// the runtime + stream every benchmark runs on.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kdtree/kdtree.h"
#include "runtime/driver.hpp"

namespace kdtree::bench {

inline void check(kdtree_status status, const char* what) {
  if (status != KDTREE_OK) {
    std::fprintf(stderr, "%s failed (%d): %s\n", what, int(status), kdtree_last_error());
    std::exit(1);
  }
}

inline void check_cu(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    const char* name = "?";
    driver::api().cuGetErrorName(result, &name);
    std::fprintf(stderr, "%s failed: %s\n", what, name);
    std::exit(1);
  }
}

// A device allocation (at least 16 bytes, so that empty inputs still get a valid pointer).
struct Buffer {
  CUdeviceptr ptr = 0;
  explicit Buffer(size_t bytes) { check_cu(driver::api().cuMemAlloc(&ptr, std::max<size_t>(bytes, 16)), "cuMemAlloc"); }
  template <typename T>
  explicit Buffer(const std::vector<T>& host) : Buffer(host.size() * sizeof(T)) {
    check_cu(driver::api().cuMemcpyHtoD(ptr, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD");
  }
  ~Buffer() { driver::api().cuMemFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(ptr + byte_offset);
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    std::vector<T> host(n);
    check_cu(driver::api().cuMemcpyDtoH(host.data(), ptr, n * sizeof(T)), "cuMemcpyDtoH");
    return host;
  }
};

// A pair of CUDA events on `stream`: the time from start() to stop().
class EventTimer {
 public:
  explicit EventTimer(CUstream stream) : stream_(stream) {
    check_cu(driver::api().cuEventCreate(&start_, 0), "cuEventCreate");
    check_cu(driver::api().cuEventCreate(&stop_, 0), "cuEventCreate");
  }
  ~EventTimer() {
    driver::api().cuEventDestroy(start_);
    driver::api().cuEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void start() { check_cu(driver::api().cuEventRecord(start_, stream_), "cuEventRecord"); }
  // Waits for the stop event; microseconds since start().
  double stop_us() {
    check_cu(driver::api().cuEventRecord(stop_, stream_), "cuEventRecord");
    check_cu(driver::api().cuEventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    check_cu(driver::api().cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    return ms * 1000.0;
  }

 private:
  CUstream stream_;
  CUevent start_ = nullptr, stop_ = nullptr;
};

// Times of `iters` calls, each bracketed by its own event pair, sorted ascending;
// after `warmup` untimed calls (the first call compiles or loads the cubin).
template <typename Call>
std::vector<double> per_call_us(CUstream stream, int warmup, int iters, Call&& call) {
  for (int i = 0; i < warmup; ++i) call();
  check_cu(driver::api().cuStreamSynchronize(stream), "cuStreamSynchronize");
  EventTimer timer(stream);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    timer.start();
    call();
    us.push_back(timer.stop_us());
  }
  std::sort(us.begin(), us.end());
  return us;
}

inline double median(const std::vector<double>& sorted) { return sorted[sorted.size() / 2]; }

// Mean time per call of `iters` calls enqueued back to back (launch-bound throughput).
template <typename Call>
double back_to_back_us(CUstream stream, int iters, Call&& call) {
  EventTimer timer(stream);
  timer.start();
  for (int i = 0; i < iters; ++i) call();
  return timer.stop_us() / iters;
}

// False, after saying so, when there is no GPU to time on (benchmarks then exit 0).
inline bool gpu_available(const char* bench) {
  std::string why;
  if (driver::available(&why)) return true;
  std::printf("%s: no GPU, nothing to time (%s)\n", bench, why.c_str());
  return false;
}

// A runtime bound to device 0's primary context, its arch, and a stream.
struct Session {
  kdtree_runtime* rt = nullptr;
  int sm = 0;
  CUstream stream = nullptr;
  Session() {
    check(kdtree_runtime_create(0, nullptr, &rt), "kdtree_runtime_create");
    check(kdtree_runtime_bind_context(rt), "kdtree_runtime_bind_context");
    check(kdtree_runtime_arch(rt, &sm), "kdtree_runtime_arch");
    check_cu(driver::api().cuStreamCreate(&stream, 0), "cuStreamCreate");
  }
  ~Session() {
    driver::api().cuStreamDestroy(stream);
    kdtree_runtime_destroy(rt);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

}  // namespace kdtree::bench
