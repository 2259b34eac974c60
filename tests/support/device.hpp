// Test helpers for device memory through kdtree's dlopen'ed driver table.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/driver.hpp"

namespace kdtree::test {

// Owns a device allocation. Poisoned (every byte 0xFF: NaN for floats, -1 for
// ints) on creation so that an unwritten output never passes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    driver::check(driver::api().cuMemAlloc(&ptr_, bytes_), "cuMemAlloc");
    poison();
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) driver::api().cuMemFree(ptr_);
  }

  void poison(unsigned char byte = 0xFF) {
    if (ptr_) driver::check(driver::api().cuMemsetD8(ptr_, byte, bytes_), "cuMemsetD8");
  }
  template <typename T>
  void upload(const std::vector<T>& host) {
    if (!host.empty())
      driver::check(driver::api().cuMemcpyHtoD(ptr_, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD");
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");
    if (!host.empty()) driver::check(driver::api().cuMemcpyDtoH(host.data(), ptr_, bytes_), "cuMemcpyDtoH");
    return host;
  }
  template <typename T = void>
  T* get() const {
    return reinterpret_cast<T*>(ptr_);
  }
  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

}  // namespace kdtree::test
