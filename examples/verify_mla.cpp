// verify_mla: tree attention for a DeepSeek-style MLA layer through kdtree's C ABI.
//
// A batch of 4 requests, 16 query heads, one 576-dim latent KV head (V = its
// first 512 dims) in a paged cache (64-token pages, scattered), prefixes of
// 1-4K tokens and a random draft tree of up to 64 nodes per request. Runs
// kdtree_verify_attention and checks every request against the float64 CPU
// reference. Memory goes through the CUDA Driver API (libcuda).
//
//   verify_mla [seed]      exit 0 = PASS (or no GPU: "skipped"), 1 = FAIL
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/cuda_driver.hpp"
#include "kdtree/kdtree.h"
#include "kdtree/kdtree.hpp"
#include "reference/verify_attention.hpp"
#include "reference/verify_case.hpp"

namespace {

// Throws with kdtree's message when a C ABI call fails.
void check(kdtree_status status, const char* what) {
  if (status != KDTREE_OK) throw kdtree::Exception(status, std::string(what) + ": " + kdtree_last_error());
}

// A device allocation through the Driver API.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    if (bytes_) example::cu(cuMemAlloc(&ptr_, bytes_), "cuMemAlloc");
  }
  template <typename T>
  explicit DeviceMemory(const std::vector<T>& host) : DeviceMemory(host.size() * sizeof(T)) {
    if (bytes_) example::cu(cuMemcpyHtoD(ptr_, host.data(), bytes_), "cuMemcpyHtoD");
  }
  ~DeviceMemory() {
    if (ptr_) cuMemFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    example::cu(cuMemcpyDtoH(host.data(), ptr_, bytes_), "cuMemcpyDtoH");
    return host;
  }
  template <typename T = void>
  T* get() const {
    return reinterpret_cast<T*>(ptr_);
  }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

int run(uint64_t seed) {
  kdtree_runtime* rt = nullptr;
  check(kdtree_runtime_create(0, nullptr, &rt), "kdtree_runtime_create");
  struct Destroy {
    kdtree_runtime* rt;
    ~Destroy() { kdtree_runtime_destroy(rt); }
  } destroy{rt};
  check(kdtree_runtime_bind_context(rt), "kdtree_runtime_bind_context");
  int sm = 0;
  check(kdtree_runtime_arch(rt, &sm), "kdtree_runtime_arch");

  // MLA 576/512: 16 query heads on one latent KV head, pages of 64, W = 64.
  const kdtree_verify_spec spec = kdtree::ref::make_verify_spec(576, 512, 16, 1, 64, 64, KDTREE_DTYPE_BF16);
  kdtree::ref::VerifyCaseOptions options;
  options.min_prefix = 1000;
  options.max_prefix = 4000;
  options.min_nodes = 8;
  options.scatter_pages = true;
  const int batch = 4;
  const kdtree::ref::VerifyCase c = kdtree::ref::build_verify_case(spec, batch, seed, options);
  std::printf("%s on sm_%d, seed %llu: %d tree nodes, %d of %d pages used\n", c.label().c_str(), sm,
              (unsigned long long)seed, c.total_nodes, c.num_pages - options.extra_pages, c.num_pages);

  DeviceMemory q(c.q), k_cache(c.k_cache), page_table(c.page_table), kv_lens(c.kv_lens), node_indptr(c.node_indptr),
      tree_mask(c.tree_mask);
  DeviceMemory out(c.out_elems() * sizeof(uint16_t)), lse(c.lse_elems() * sizeof(float)), flags(sizeof(int32_t));
  example::cu(cuMemsetD32(reinterpret_cast<CUdeviceptr>(flags.get()), 0, 1), "cuMemsetD32");
  size_t workspace_bytes = 0;
  check(kdtree_verify_workspace_size(rt, &spec, c.batch_size, c.total_nodes, c.max_kv_len, &workspace_bytes),
        "kdtree_verify_workspace_size");
  DeviceMemory workspace(workspace_bytes);

  kdtree_verify_args args{};
  args.spec = spec;
  args.batch_size = c.batch_size;
  args.total_nodes = c.total_nodes;
  args.max_kv_len = c.max_kv_len;
  args.num_pages = c.num_pages;
  args.q = q.get();
  args.node_indptr = node_indptr.get<const int32_t>();
  args.k_cache = k_cache.get();
  args.v_cache = nullptr;  // MLA: V is the first 512 dims of each cached row
  args.page_table = page_table.get<const int32_t>();
  args.max_pages_per_req = c.max_pages_per_req;
  args.kv_lens = kv_lens.get<const int32_t>();
  args.tree_mask = tree_mask.get<const uint64_t>();
  args.sm_scale = c.sm_scale;
  args.out = out.get();
  args.lse = lse.get<float>();
  args.workspace = workspace.get();
  args.workspace_size = workspace_bytes;
  args.error_flags = flags.get<int32_t>();
  args.stream = nullptr;
  args.num_splits = 0;  // chosen from the shape and the SM count

  // The first call compiles the kernel (or loads it from the cubin cache).
  auto t0 = std::chrono::steady_clock::now();
  check(kdtree_verify_attention(rt, &args), "kdtree_verify_attention");
  example::cu(cuCtxSynchronize(), "cuCtxSynchronize");
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // A warm call, timed on the stream.
  CUevent start, stop;
  example::cu(cuEventCreate(&start, 0), "cuEventCreate");
  example::cu(cuEventCreate(&stop, 0), "cuEventCreate");
  example::cu(cuEventRecord(start, nullptr), "cuEventRecord");
  check(kdtree_verify_attention(rt, &args), "kdtree_verify_attention");
  example::cu(cuEventRecord(stop, nullptr), "cuEventRecord");
  example::cu(cuEventSynchronize(stop), "cuEventSynchronize");
  float warm_ms = 0;
  example::cu(cuEventElapsedTime(&warm_ms, start, stop), "cuEventElapsedTime");
  cuEventDestroy(start);
  cuEventDestroy(stop);
  std::printf("first call (compile or cache load + run) %.1f ms, warm call %.3f ms\n", first_ms, warm_ms);

  const std::vector<uint16_t> out_host = out.download<uint16_t>();
  const std::vector<float> lse_host = lse.download<float>();
  const int32_t device_flags = flags.download<int32_t>()[0];

  const kdtree::ref::VerifyReference ref = kdtree::ref::verify_attention(c.host_inputs());
  const kdtree::ref::VerifyComparison cmp = kdtree::ref::compare_verify(c, ref, out_host, lse_host.data());
  const double tolerance = 1e-2;  // bf16
  for (int b = 0; b < batch; ++b)
    std::printf("  request %d: prefix %5d, %2d tree nodes, rel err %.3e\n", b, c.prefix_lens[b], c.node_counts[b],
                cmp.rel_err[b]);
  std::printf("  max abs err %.3e, lse max abs err %.3e, non-finite outputs %zu, error flags %d\n", cmp.max_abs,
              cmp.max_lse_abs, cmp.nan_out + cmp.nan_lse, device_flags);
  const bool pass = cmp.ok(tolerance, 1e-2) && device_flags == 0;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  std::string why;
  if (!example::gpu_available(&why)) {
    std::printf("verify_mla: skipped: no GPU (%s)\n", why.c_str());
    return 0;
  }
  try {
    return run(seed);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verify_mla: %s\nFAIL\n", e.what());
    return 1;
  }
}
