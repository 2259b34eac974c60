// verify_attention benchmark against the roofline.
//
// For every shape: FLOPs = 2 * rows * kv_len * (Dqk + Dv) summed over requests
// (rows = tree nodes x query heads; the mask's savings are not subtracted), bytes =
// the KV each request must read once (+ Q and out). floor = max(FLOPs / tensor
// rate, bytes / HBM bandwidth). Times are the median of CUDA-event timings of the
// whole call (main kernel and combine), after warm-up, with the inputs rotated
// over several copies so that L2 does not serve them; also back-to-back calls and
// CUDA-graph replays of captured calls (the GPU time with no host work in it).
//
// e4m3 KV caches (--kv-dtype e4m3 or both, the default) run every shape again with
// 1-byte caches (random scales; bytes counted with 1-byte KV) in a row of their own,
// "NAME,e4m3", whose vs_bf16 column is the as_q row's time over its own.
//
// --prefix N replaces every shape's prefix length (its name gets "@N"), --splits S forces
// num_splits (0 = the planner's choice): the two axes that separate a kernel's per-tile
// rate from its fixed costs.
//
// usage: bench_verify [--json FILE] [--iters N] [--tflops R] [--gbps B] [--shape NAME_OR_PREFIX]
//                     [--kv-dtype both|as_q|e4m3] [--prefix N] [--splits S]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "codegen/verify_attention.hpp"
#include "kdtree/kdtree.h"
#include "reference/fp8.hpp"
#include "reference/half.hpp"
#include "runtime/c_api.hpp"
#include "runtime/driver.hpp"
#include "runtime/verify_attention.hpp"
#include "verify_shapes.hpp"

namespace {

using Shape = kdtree::bench::VerifyShape;

#define CHECK_KD(call)                                                                   \
  do {                                                                                   \
    kdtree_status s_ = (call);                                                           \
    if (s_ != KDTREE_OK) {                                                               \
      std::fprintf(stderr, "%s failed (%d): %s\n", #call, int(s_), kdtree_last_error()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

using kdtree::driver::api;
using kdtree::driver::check;

CUdeviceptr alloc_upload(const void* host, size_t bytes) {
  CUdeviceptr p = 0;
  check(api().cuMemAlloc(&p, std::max<size_t>(bytes, 16)), "cuMemAlloc");
  if (host && bytes) check(api().cuMemcpyHtoD(p, host, bytes), "cuMemcpyHtoD");
  return p;
}

std::vector<uint16_t> random_half(size_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> v(n);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : v) x = kdtree::ref::float_to_bf16(u(rng));
  return v;
}

std::vector<uint8_t> random_e4m3(size_t n, float scale, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : v) x = kdtree::ref::float_to_e4m3(u(rng) / scale);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  const char* only = nullptr;
  int iters = 50;
  int prefix_override = 0, forced_splits = 0;
  std::string kv_choice = "both";
  double tflops = 647.0, gbps = 4270.0;  // H200: mma.sync bf16 issue rate; copy bandwidth
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--tflops") && i + 1 < argc)
      tflops = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--gbps") && i + 1 < argc)
      gbps = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--kv-dtype") && i + 1 < argc)
      kv_choice = argv[++i];
    else if (!std::strcmp(argv[i], "--prefix") && i + 1 < argc)
      prefix_override = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--splits") && i + 1 < argc)
      forced_splits = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "bench_verify: unknown or incomplete option '%s'\n", argv[i]);
      return 2;
    }
  }
  std::vector<kdtree_kv_dtype> kv_dtypes;
  if (kv_choice == "both" || kv_choice == "as_q") kv_dtypes.push_back(KDTREE_KV_DTYPE_AS_Q);
  if (kv_choice == "both" || kv_choice == "e4m3") kv_dtypes.push_back(KDTREE_KV_DTYPE_E4M3);
  if (kv_dtypes.empty()) {
    std::fprintf(stderr, "bench_verify: --kv-dtype '%s' is not both, as_q or e4m3\n", kv_choice.c_str());
    return 2;
  }
  if (prefix_override < 0 || forced_splits < 0 || forced_splits > 65535) {
    std::fprintf(stderr, "bench_verify: --prefix must be >= 0 and --splits 0..65535\n");
    return 2;
  }
  std::string why;
  if (!kdtree::driver::available(&why)) {
    std::printf("bench_verify: skipped, no GPU: %s\n", why.c_str());
    return 0;
  }
  kdtree_runtime* rt = nullptr;
  CHECK_KD(kdtree_runtime_create(0, nullptr, &rt));
  CHECK_KD(kdtree_runtime_bind_context(rt));
  int sm = 0;
  CHECK_KD(kdtree_runtime_arch(rt, &sm));
  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  std::printf("verify_attention on sm_%d: floor = max(FLOPs / %.0f TFLOP/s, bytes / %.0f GB/s)\n", sm, tflops, gbps);
  std::printf("%-29s %9s %8s %8s %9s %8s %8s %8s %7s %9s %9s %8s\n", "shape", "us", "b2b_us", "graph_us", "floor_us",
              "TFLOP/s", "KV_GB/s", "of_floor", "splits", "vs_triton", "vs_flmla", "vs_bf16");
  std::mt19937_64 rng(1234);

  for (Shape s : kdtree::bench::kVerifyShapes) {
    if (only && std::strncmp(only, s.name, std::strlen(only))) continue;  // a name or a prefix
    std::string base_name = s.name;
    if (prefix_override > 0) {
      s.prefix = prefix_override;
      base_name += "@" + std::to_string(prefix_override);
    }
    if (forced_splits > 0) base_name += "/s" + std::to_string(forced_splits);
    double as_q_us = 0;  // this shape's 16-bit time, for the e4m3 row's vs_bf16
    for (const kdtree_kv_dtype kv_dtype : kv_dtypes) {
      const bool fp8 = kv_dtype == KDTREE_KV_DTYPE_E4M3;
      const int kv_elem_bytes = fp8 ? 1 : 2;
      const std::string name = base_name + (fp8 ? ",e4m3" : "");
      const int W = kdtree::bench::verify_width(s.nodes);
      const bool mla = s.head_qk == 576;
      const int kv_len = s.prefix + s.nodes;
      const int pages_per_req = (kv_len + s.page - 1) / s.page;
      const int num_pages = pages_per_req * s.batch;
      const int total_nodes = s.nodes * s.batch;
      const size_t k_elems = size_t(num_pages) * s.page * s.kv_heads * s.head_qk;
      const size_t v_elems = mla ? 0 : size_t(num_pages) * s.page * s.kv_heads * s.head_v;
      const double kv_bytes = double(k_elems + v_elems) * kv_elem_bytes;
      const int copies = std::clamp(int(std::ceil(256e6 / kv_bytes)), 2, 12);

      kdtree_verify_spec spec{s.head_qk, s.head_v, s.q_heads, s.kv_heads, s.page, W, KDTREE_DTYPE_BF16, kv_dtype};
      // Page tables scattered over the physical pages.
      std::vector<int32_t> perm(num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> indptr(s.batch + 1), kv_lens(s.batch, kv_len);
      for (int b = 0; b <= s.batch; ++b) indptr[b] = b * s.nodes;
      // A chain-shaped tree mask: node i sees nodes 0..i.
      const int words = (W + 63) / 64;
      std::vector<uint64_t> mask(size_t(total_nodes) * words, 0);
      for (int n = 0; n < total_nodes; ++n)
        for (int j = 0; j <= n % s.nodes; ++j) mask[size_t(n) * words + j / 64] |= 1ull << (j % 64);

      struct Set {
        CUdeviceptr q, k, v;
      };
      std::vector<Set> sets;
      auto q_host = random_half(size_t(total_nodes) * s.q_heads * s.head_qk, rng);
      // e4m3: values in [-1, 1] stored as code x scale, the scale mapping 1 to 192.
      const float k_scale = 1.0f / 192, v_scale = 1.0f / 160;
      std::vector<uint16_t> k_host, v_host;
      std::vector<uint8_t> k_host8, v_host8;
      if (fp8) {
        k_host8 = random_e4m3(k_elems, k_scale, rng);
        v_host8 = random_e4m3(v_elems, v_scale, rng);
      } else {
        k_host = random_half(k_elems, rng);
        v_host = random_half(v_elems, rng);
      }
      const void* k_data = fp8 ? (const void*)k_host8.data() : (const void*)k_host.data();
      const void* v_data = fp8 ? (const void*)v_host8.data() : (const void*)v_host.data();
      for (int c = 0; c < copies; ++c) {
        Set set{alloc_upload(q_host.data(), q_host.size() * 2), alloc_upload(k_data, k_elems * kv_elem_bytes),
                mla ? 0 : alloc_upload(v_data, v_elems * kv_elem_bytes)};
        sets.push_back(set);
      }
      CUdeviceptr d_indptr = alloc_upload(indptr.data(), indptr.size() * 4);
      CUdeviceptr d_kv = alloc_upload(kv_lens.data(), kv_lens.size() * 4);
      CUdeviceptr d_pt = alloc_upload(perm.data(), perm.size() * 4);
      CUdeviceptr d_mask = alloc_upload(mask.data(), mask.size() * 8);
      CUdeviceptr d_out = alloc_upload(nullptr, size_t(total_nodes) * s.q_heads * s.head_v * 2);
      CUdeviceptr d_lse = alloc_upload(nullptr, size_t(total_nodes) * s.q_heads * 4);
      size_t ws_bytes = 0;
      CHECK_KD(kdtree_verify_workspace_size(rt, &spec, s.batch, total_nodes, kv_len, &ws_bytes));
      if (forced_splits > 0) ws_bytes = kdtree::verify_workspace_bytes(spec, total_nodes, forced_splits);
      CUdeviceptr d_ws = alloc_upload(nullptr, ws_bytes);

      kdtree_verify_args a{};
      a.spec = spec;
      a.batch_size = s.batch;
      a.total_nodes = total_nodes;
      a.max_kv_len = kv_len;
      a.num_pages = num_pages;
      a.node_indptr = reinterpret_cast<const int32_t*>(d_indptr);
      a.page_table = reinterpret_cast<const int32_t*>(d_pt);
      a.max_pages_per_req = pages_per_req;
      a.kv_lens = reinterpret_cast<const int32_t*>(d_kv);
      a.tree_mask = reinterpret_cast<const uint64_t*>(d_mask);
      a.sm_scale = 1.f / std::sqrt(float(s.head_qk));
      a.out = reinterpret_cast<void*>(d_out);
      a.lse = reinterpret_cast<float*>(d_lse);
      a.workspace = reinterpret_cast<void*>(d_ws);
      a.workspace_size = ws_bytes;
      a.num_splits = forced_splits;
      if (fp8) {
        a.k_scale = k_scale;
        a.v_scale = v_scale;
      }
      auto run = [&](int c) {
        a.q = reinterpret_cast<const void*>(sets[c].q);
        a.k_cache = reinterpret_cast<const void*>(sets[c].k);
        a.v_cache = mla ? nullptr : reinterpret_cast<const void*>(sets[c].v);
        CHECK_KD(kdtree_verify_attention(rt, &a));
      };
      for (int i = 0; i < 5; ++i) run(i % copies);  // compile, load, warm up
      check(api().cuCtxSynchronize(), "warm-up");
      CUevent e0, e1;
      check(api().cuEventCreate(&e0, 0), "cuEventCreate");
      check(api().cuEventCreate(&e1, 0), "cuEventCreate");
      std::vector<float> ms;
      for (int i = 0; i < iters; ++i) {
        check(api().cuEventRecord(e0, nullptr), "cuEventRecord");
        run(i % copies);
        check(api().cuEventRecord(e1, nullptr), "cuEventRecord");
        check(api().cuEventSynchronize(e1), "cuEventSynchronize");
        float t = 0;
        check(api().cuEventElapsedTime(&t, e0, e1), "cuEventElapsedTime");
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double us = ms[ms.size() / 2] * 1e3;
      // Back to back: the host enqueues the next call while the GPU runs the last,
      // as a serving loop does; the per-call host work then hides behind the GPU.
      check(api().cuEventRecord(e0, nullptr), "cuEventRecord");
      for (int i = 0; i < iters; ++i) run(i % copies);
      check(api().cuEventRecord(e1, nullptr), "cuEventRecord");
      check(api().cuEventSynchronize(e1), "cuEventSynchronize");
      float total_ms = 0;
      check(api().cuEventElapsedTime(&total_ms, e0, e1), "cuEventElapsedTime");
      const double b2b_us = total_ms * 1e3 / iters;
      // CUDA graph replay (what a serving engine captures): one graph per input copy,
      // captured on a stream of its own; the median of single replays is the GPU time
      // of the whole call with no host work in it. Capture also proves the call has no
      // host synchronisation or allocation inside.
      CUstream stream = nullptr;
      check(api().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      std::vector<CUgraphExec> graphs(copies);
      a.stream = stream;
      for (int c = 0; c < copies; ++c) {
        CUgraph graph = nullptr;
        check(api().cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
        run(c);
        check(api().cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
        check(api().cuGraphInstantiateWithFlags(&graphs[c], graph, 0), "cuGraphInstantiate");
        check(api().cuGraphDestroy(graph), "cuGraphDestroy");
      }
      a.stream = nullptr;
      std::vector<float> graph_ms;
      for (int i = 0; i < iters + 3; ++i) {
        check(api().cuEventRecord(e0, stream), "cuEventRecord");
        check(api().cuGraphLaunch(graphs[i % copies], stream), "cuGraphLaunch");
        check(api().cuEventRecord(e1, stream), "cuEventRecord");
        check(api().cuEventSynchronize(e1), "cuEventSynchronize");
        float t = 0;
        check(api().cuEventElapsedTime(&t, e0, e1), "cuEventElapsedTime");
        if (i >= 3) graph_ms.push_back(t);  // the first replays upload the graphs
      }
      std::sort(graph_ms.begin(), graph_ms.end());
      const double graph_us = graph_ms[graph_ms.size() / 2] * 1e3;
      for (CUgraphExec g : graphs) api().cuGraphExecDestroy(g);
      api().cuStreamDestroy(stream);
      const double flops = 2.0 * total_nodes * s.q_heads * double(kv_len) * (s.head_qk + s.head_v);
      const double bytes = double(s.batch) * kv_len * s.kv_heads * (s.head_qk + (mla ? 0 : s.head_v)) * kv_elem_bytes +
                           double(total_nodes) * s.q_heads * (s.head_qk + s.head_v) * 2;
      const double floor_us = std::max(flops / (tflops * 1e6), bytes / (gbps * 1e3));
      const double achieved_tflops = flops / us / 1e6;
      const double achieved_gbps = bytes / us / 1e3;
      // The runtime's plan for this call (its tiles: KDTREE_VERIFY_TILES applies).
      const kdtree::codegen::Arch& arch = kdtree::unwrap(rt).arch();
      const kdtree::VerifyPlan plan = kdtree::plan_verify(
          kdtree::codegen::generate_verify_attention(kdtree::codegen::validate_verify_spec(spec), arch).launch, arch,
          spec, s.batch, total_nodes, kv_len, forced_splits);
      const int splits = plan.num_splits, stream_ctas = plan.stream_ctas;
      char plan_text[16];
      if (stream_ctas > 0) {
        std::snprintf(plan_text, sizeof plan_text, "sk%d", stream_ctas);  // stream-K over this many CTAs
      } else {
        std::snprintf(plan_text, sizeof plan_text, "%d", splits);
      }
      char vs_triton[16] = "-", vs_fm[16] = "-";
      if (s.triton_us > 0) std::snprintf(vs_triton, sizeof vs_triton, "%.1fx", s.triton_us / us);
      if (s.flashmla_us > 0) std::snprintf(vs_fm, sizeof vs_fm, "%.2fx", s.flashmla_us / us);
      char vs_bf16[16] = "-";
      if (!fp8) as_q_us = us;
      if (fp8 && as_q_us > 0) std::snprintf(vs_bf16, sizeof vs_bf16, "%.2fx", as_q_us / us);
      std::printf("%-29s %9.1f %8.1f %8.1f %9.1f %8.1f %8.0f %7.0f%% %7s %9s %9s %8s\n", name.c_str(), us, b2b_us,
                  graph_us, floor_us, achieved_tflops, achieved_gbps, 100.0 * floor_us / us, plan_text, vs_triton,
                  vs_fm, vs_bf16);
      if (json) {
        std::fprintf(
            json,
            "{\"shape\":\"%s\",\"batch\":%d,\"q_heads\":%d,\"kv_heads\":%d,\"nodes\":%d,\"prefix\":%d,"
            "\"head_qk\":%d,\"head_v\":%d,\"page\":%d,\"us\":%.2f,\"b2b_us\":%.2f,\"graph_us\":%.2f,\"floor_"
            "us\":%.2f,\"tflops\":%.1f,"
            "\"gbps\":%.0f,\"of_floor\":%.3f,\"splits\":%d,\"stream_ctas\":%d,\"sm\":%d,\"kv_dtype\":\"%s\"}\n",
            base_name.c_str(), s.batch, s.q_heads, s.kv_heads, s.nodes, s.prefix, s.head_qk, s.head_v, s.page, us,
            b2b_us, graph_us, floor_us, achieved_tflops, achieved_gbps, floor_us / us, splits, stream_ctas, sm,
            kdtree::codegen::kv_dtype_name(kv_dtype));
      }
      api().cuEventDestroy(e0);
      api().cuEventDestroy(e1);
      for (auto& set : sets) {
        api().cuMemFree(set.q);
        api().cuMemFree(set.k);
        if (set.v) api().cuMemFree(set.v);
      }
      for (CUdeviceptr p : {d_indptr, d_kv, d_pt, d_mask, d_out, d_lse, d_ws}) api().cuMemFree(p);
    }  // kv_dtype
  }
  if (json) std::fclose(json);
  kdtree_runtime_destroy(rt);
  return 0;
}
