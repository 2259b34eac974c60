// kdtree C++ API: a header-only layer over the C ABI in kdtree.h.
//
// Link libkdtree.so (CMake: find_package(kdtree) + target_link_libraries(app kdtree::kdtree)).
// Every failing call throws kdtree::Exception carrying the kdtree_status and the
// message of kdtree_last_error(); nothing here returns an error code.
//
// Units and ownership (as in kdtree.h):
//  - Buffers in the argument structs are CUDA device pointers owned by the caller
//    (cudaMalloc, cuMemAlloc, torch tensors). kdtree never allocates, frees or
//    synchronises on the launch path; results are ready when `stream` says so.
//  - `stream` is a CUstream / cudaStream_t passed as void*; nullptr = legacy default stream.
//  - Sizes are in elements unless named *_bytes / workspace_size (bytes).
//  - Arch numbers are compute capability * 10: 90 = sm_90 (H100/H200), 120 = sm_120.
//  - A Runtime is bound to one device, may be shared by threads, and owns its
//    compiled modules; destroy it after the last launch that uses it has finished.
//
// Example:
//   auto rt = kdtree::Runtime::create(0);          // cache: $KDTREE_CACHE_DIR or ~/.cache/kdtree
//   rt.bind_context();                               // before cuMemAlloc in Driver API programs
//   kdtree_verify_args args{};
//   args.spec = kdtree::mla_spec(/*num_q_heads=*/16, /*page_size=*/64, /*max_tree_nodes=*/64);
//   ...                                              // device pointers, sizes, sm_scale
//   args.workspace_size = rt.workspace_size(args.spec, args.batch_size, args.total_nodes, args.max_kv_len);
//   rt.verify_attention(args);
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "kdtree/kdtree.h"

namespace kdtree {
// The inline namespace gives these classes their own link names, so a program
// that also links kdtree's internal C++ classes (tests, tools) sees no clash.
inline namespace api {

// A failed kdtree call: status() is the kdtree_status, what() the message.
class Exception : public std::runtime_error {
 public:
  Exception(kdtree_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  kdtree_status status() const noexcept { return status_; }

 private:
  kdtree_status status_;
};

// Throws kdtree::Exception unless `status` is KDTREE_OK.
inline void check(kdtree_status status) {
  if (status == KDTREE_OK) return;
  const char* message = kdtree_last_error();
  throw Exception(status, message && *message
                              ? message
                              : "kdtree call failed with status " + std::to_string(static_cast<int>(status)));
}

// "MAJOR.MINOR.PATCH" of the loaded library.
inline std::string version() { return kdtree_version(); }

// The spec of an MLA (absorbed, 576/512) verify_attention: one shared KV head.
inline kdtree_verify_spec mla_spec(int num_q_heads, int page_size, int max_tree_nodes,
                                   kdtree_dtype dtype = KDTREE_DTYPE_BF16) {
  kdtree_verify_spec s{};
  s.head_dim_qk = 576;
  s.head_dim_v = 512;
  s.num_q_heads = num_q_heads;
  s.num_kv_heads = 1;
  s.page_size = page_size;
  s.max_tree_nodes = max_tree_nodes;
  s.dtype = dtype;
  return s;
}

// The spec of a GQA/MHA verify_attention (head_dim 64, 128 or 256 for K and V).
inline kdtree_verify_spec gqa_spec(int head_dim, int num_q_heads, int num_kv_heads, int page_size, int max_tree_nodes,
                                   kdtree_dtype dtype = KDTREE_DTYPE_BF16) {
  kdtree_verify_spec s{};
  s.head_dim_qk = head_dim;
  s.head_dim_v = head_dim;
  s.num_q_heads = num_q_heads;
  s.num_kv_heads = num_kv_heads;
  s.page_size = page_size;
  s.max_tree_nodes = max_tree_nodes;
  s.dtype = dtype;
  return s;
}

// Owns a kdtree_runtime (RAII, move-only). A default-constructed Runtime holds
// nothing; calling an operation on it throws KDTREE_ERROR_INVALID_ARGUMENT.
class Runtime {
 public:
  Runtime() noexcept = default;
  // Takes ownership of a handle from kdtree_runtime_create*.
  explicit Runtime(kdtree_runtime* handle) noexcept : handle_(handle) {}
  Runtime(Runtime&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Runtime& operator=(Runtime&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime() { reset(); }

  // A runtime for CUDA device `device`. The driver loads at first device use,
  // so this succeeds without a GPU. cache_dir "" = $KDTREE_CACHE_DIR, else
  // $XDG_CACHE_HOME/kdtree, else ~/.cache/kdtree.
  static Runtime create(int device = 0, const std::string& cache_dir = std::string()) {
    kdtree_runtime* rt = nullptr;
    check(kdtree_runtime_create(device, cache_dir.empty() ? nullptr : cache_dir.c_str(), &rt));
    return Runtime(rt);
  }

  // A compile-only runtime for an arch (e.g. 120, 90): warm() fills the cache
  // without a GPU; launching through it fails.
  static Runtime offline(int sm_arch, const std::string& cache_dir = std::string()) {
    kdtree_runtime* rt = nullptr;
    check(kdtree_runtime_create_offline(sm_arch, cache_dir.empty() ? nullptr : cache_dir.c_str(), &rt));
    return Runtime(rt);
  }

  // Makes the device's primary context current on this thread (loads the driver).
  void bind_context() { check(kdtree_runtime_bind_context(handle_)); }

  // The sm arch kernels are compiled for (e.g. 90, 120).
  int arch() const {
    int sm = 0;
    check(kdtree_runtime_arch(handle_, &sm));
    return sm;
  }

  // Bytes of device workspace verify_attention needs for these host-known sizes.
  size_t workspace_size(const kdtree_verify_spec& spec, int batch_size, int total_nodes, int max_kv_len) const {
    size_t bytes = 0;
    check(kdtree_verify_workspace_size(handle_, &spec, batch_size, total_nodes, max_kv_len, &bytes));
    return bytes;
  }

  // Operations: enqueued on args.stream; no host synchronisation.
  void verify_attention(const kdtree_verify_args& args) { check(kdtree_verify_attention(handle_, &args)); }
  void tree_build(const kdtree_tree_build_args& args) { check(kdtree_tree_build(handle_, &args)); }
  void tree_accept(const kdtree_tree_accept_args& args) { check(kdtree_tree_accept(handle_, &args)); }
  void tree_allocate(const kdtree_tree_allocate_args& args) { check(kdtree_tree_allocate(handle_, &args)); }
  void sample_tokens(const kdtree_sample_args& args) { check(kdtree_sample_tokens(handle_, &args)); }
  void kv_compact(const kdtree_kv_compact_args& args) { check(kdtree_kv_compact(handle_, &args)); }

  // Compiles (or loads from the cache) every kernel `spec` needs, ahead of time.
  void warm(const kdtree_verify_spec& spec) { check(kdtree_warm(handle_, &spec)); }

  // The C handle, still owned by this object (for the C ABI or other languages).
  kdtree_runtime* handle() const noexcept { return handle_; }
  // Gives up ownership; the caller destroys the handle with kdtree_runtime_destroy.
  kdtree_runtime* release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  void reset() noexcept {
    // Destroy cannot usefully fail; a destructor must not throw.
    if (handle_) kdtree_runtime_destroy(std::exchange(handle_, nullptr));
  }
  kdtree_runtime* handle_ = nullptr;
};

}  // namespace api
}  // namespace kdtree
