// Times kdtree_sample_tokens and kdtree_kv_compact through the C ABI.
//
// sample_tokens: rows {1, 64, 1024} x vocab {32000, 129280, 256000} x logits
// bf16/f32 x greedy / T = 0.8. Logits are normal(0, 2) (rounded to bf16 values).
// Bytes = the logits read once; GB/s is compared with HBM (default 4270 GB/s,
// H200). Each call reads a different copy of the logits from a pool of at least
// 256 MB, so L2 does not serve them.
//
// kv_compact: MLA (one 576-element bf16 row) and GQA (K and V rows of 8 x 128)
// with 61 layers, B {1, 8, 64}, W {16, 64}, page 64, full trees (n_b = W) and
// the path 0, 2, 4, ..., W/2 (W/4 moved rows per request and cache). Bytes =
// moved rows read and written. The same rows move on every call, so small
// shapes are served from L2.
//
// Each call is bracketed by CUDA events (driver table); the median after warm-up
// is reported. Prints a table and one JSON line per point. Exits 0 with a
// message when there is no GPU.
//
// usage: bench_sample_compact [--iters N] [--gbps B]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_support.hpp"
#include "kdtree/kdtree.h"
#include "reference/half.hpp"
#include "reference/kv_compact.hpp"
#include "reference/sample_tokens.hpp"
#include "runtime/driver.hpp"

using kdtree::bench::Buffer;
using kdtree::bench::check;
using kdtree::bench::check_cu;

namespace {

// Median of per-call event pairs after 10 warm-up calls.
template <typename Call>
double median_us(CUstream stream, int iters, Call&& call) {
  return kdtree::bench::median(kdtree::bench::per_call_us(stream, 10, iters, call));
}

struct Options {
  int iters = 50;
  double hbm_gbps = 4270.0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--gbps") && i + 1 < argc) {
      o.hbm_gbps = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--gbps B]\n", argv[0]);
      std::exit(2);
    }
  }
  return o;
}

void bench_sample(kdtree_runtime* rt, CUstream stream, int sm, const Options& o, std::vector<std::string>& json) {
  const auto& api = kdtree::driver::api();
  std::mt19937_64 rng(2025);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  // Host logits are drawn from a pool (bf16 values), row r at a scattered offset.
  std::vector<float> pool(size_t(1) << 22);
  for (float& x : pool) x = kdtree::ref::bf16_to_float(kdtree::ref::float_to_bf16(normal(rng)));

  std::printf("\nsample_tokens (HBM %.0f GB/s)\n", o.hbm_gbps);
  std::printf("%5s %7s %5s %6s | %10s %9s %7s | %s\n", "rows", "vocab", "dtype", "T", "median us", "GB/s", "% HBM",
              "reference (first rows)");
  for (int rows : {1, 64, 1024}) {
    for (int vocab : {32000, 129280, 256000}) {
      for (kdtree_dtype dtype : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
        const size_t elem = dtype == KDTREE_DTYPE_BF16 ? 2 : 4;
        const size_t n = size_t(rows) * vocab;
        const size_t bytes = n * elem;
        const size_t copies = std::min<size_t>(4096, std::max<size_t>(1, ((size_t(256) << 20) + bytes - 1) / bytes));
        std::vector<float> host(n);
        for (int r = 0; r < rows; ++r) {
          const size_t at = (size_t(r) * 7919 * 1013) % (pool.size() - vocab);
          std::copy_n(pool.begin() + at, vocab, host.begin() + size_t(r) * vocab);
        }
        Buffer logits(copies * bytes);
        if (dtype == KDTREE_DTYPE_BF16) {
          std::vector<uint16_t> h(n);
          for (size_t i = 0; i < n; ++i) h[i] = kdtree::ref::float_to_bf16(host[i]);
          check_cu(api.cuMemcpyHtoD(logits.ptr, h.data(), bytes), "cuMemcpyHtoD");
        } else {
          check_cu(api.cuMemcpyHtoD(logits.ptr, host.data(), bytes), "cuMemcpyHtoD");
        }
        for (size_t c = 1; c < copies; ++c) {
          check_cu(api.cuMemcpyDtoD(logits.ptr + c * bytes, logits.ptr, bytes), "cuMemcpyDtoD");
        }
        Buffer out(size_t(rows) * 4);
        for (float T : {0.0f, 0.8f}) {
          kdtree_sample_args a{};
          a.num_rows = rows;
          a.vocab_size = vocab;
          a.logits_dtype = dtype;
          a.temperature = T;
          a.seed = 7;
          a.out_tokens = out.as<int32_t>();
          a.stream = stream;
          size_t next = 0;
          const double us = median_us(stream, o.iters, [&] {
            a.logits = logits.as<const void>((next++ % copies) * bytes);
            check(kdtree_sample_tokens(rt, &a), "kdtree_sample_tokens");
          });
          // The first rows of copy 0 against the CPU reference.
          a.logits = logits.as<const void>();
          check(kdtree_sample_tokens(rt, &a), "kdtree_sample_tokens");
          check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize");
          const int checked = std::min(rows, 4);
          kdtree::ref::SampleInput in;
          in.num_rows = checked;
          in.vocab_size = vocab;
          in.temperature = T;
          in.seed = 7;
          in.logits.assign(host.begin(), host.begin() + size_t(checked) * vocab);
          const std::vector<int32_t> want = kdtree::ref::sample_tokens(in);
          const std::vector<int32_t> got = out.download<int32_t>(checked);
          int mismatches = 0;
          for (int r = 0; r < checked; ++r) mismatches += got[r] != want[r];

          const double gbps = bytes / (us * 1e3);
          const char* dname = dtype == KDTREE_DTYPE_BF16 ? "bf16" : "f32";
          std::printf("%5d %7d %5s %6.2f | %10.2f %9.1f %6.1f%% | %d/%d match\n", rows, vocab, dname, T, us, gbps,
                      100.0 * gbps / o.hbm_gbps, checked - mismatches, checked);
          char line[512];
          std::snprintf(line, sizeof line,
                        "{\"bench\":\"sample_tokens\",\"sm\":%d,\"rows\":%d,\"vocab\":%d,\"dtype\":\"%s\","
                        "\"temperature\":%.2f,\"median_us\":%.3f,\"bytes\":%zu,\"gb_per_s\":%.1f,"
                        "\"fraction_of_hbm\":%.4f,\"reference_rows\":%d,\"reference_mismatches\":%d}",
                        sm, rows, vocab, dname, T, us, bytes, gbps, gbps / o.hbm_gbps, checked, mismatches);
          json.emplace_back(line);
        }
      }
    }
  }
}

void bench_compact(kdtree_runtime* rt, CUstream stream, int sm, const Options& o, std::vector<std::string>& json) {
  const auto& api = kdtree::driver::api();
  std::mt19937_64 rng(2026);
  const int layers = 61, page = 64;
  struct Model {
    const char* name;
    int row_k, row_v;
  };
  const Model models[] = {{"mla576", 576, 0}, {"gqa8x128", 1024, 1024}};
  std::printf("\nkv_compact (%d layers, page %d, HBM %.0f GB/s)\n", layers, page, o.hbm_gbps);
  std::printf("%9s %3s %4s | %11s | %10s %9s %7s | %s\n", "model", "B", "W", "rows moved", "median us", "GB/s", "% HBM",
              "error_flags");
  for (const Model& m : models) {
    for (int B : {1, 8, 64}) {
      for (int W : {16, 64}) {
        kdtree::ref::KvCompactInput in;
        in.batch_size = B;
        in.max_tree_nodes = W;
        in.page_size = page;
        in.max_pages_per_req = (400 + W + page - 1) / page;
        in.num_pages = B * in.max_pages_per_req;
        std::vector<int32_t> pages(static_cast<size_t>(in.num_pages));
        for (int i = 0; i < in.num_pages; ++i) pages[i] = i;
        std::shuffle(pages.begin(), pages.end(), rng);
        in.page_table = pages;
        const int accept = W / 4;
        for (int b = 0; b < B; ++b) {
          in.node_counts.push_back(W);
          in.kv_lens.push_back(W + 100 + static_cast<int>(rng() % 300));
          std::vector<int32_t> path(static_cast<size_t>(W), -1);
          for (int j = 0; j <= accept; ++j) path[j] = 2 * j;
          in.accepted_path.insert(in.accepted_path.end(), path.begin(), path.end());
          in.accept_lens.push_back(accept);
        }
        long long moved = 0;
        for (int b = 0; b < B; ++b) moved += kdtree::ref::kv_compact_moved_rows(in, b);

        const size_t rows_per_layer = size_t(in.num_pages) * page;
        const size_t k_bytes = rows_per_layer * m.row_k * 2, v_bytes = rows_per_layer * m.row_v * 2;
        Buffer k_pool(k_bytes * layers), v_pool(std::max<size_t>(v_bytes * layers, 16));
        check_cu(api.cuMemsetD8(k_pool.ptr, 0x3c, k_bytes * layers), "cuMemsetD8");
        if (v_bytes) check_cu(api.cuMemsetD8(v_pool.ptr, 0x3c, v_bytes * layers), "cuMemsetD8");
        std::vector<uint64_t> k_ptrs, v_ptrs;
        for (int l = 0; l < layers; ++l) {
          k_ptrs.push_back(k_pool.ptr + l * k_bytes);
          v_ptrs.push_back(v_pool.ptr + l * v_bytes);
        }
        Buffer kp(k_ptrs), vp(v_ptrs), table(in.page_table), kv_lens(in.kv_lens), counts(in.node_counts),
            path(in.accepted_path), lens(in.accept_lens), flags(std::vector<int32_t>{0});

        kdtree_kv_compact_args a{};
        a.num_layers = layers;
        a.batch_size = B;
        a.max_tree_nodes = W;
        a.page_size = page;
        a.num_pages = in.num_pages;
        a.row_elems_k = m.row_k;
        a.row_elems_v = m.row_v;
        a.dtype = KDTREE_DTYPE_BF16;
        a.k_caches = kp.as<const uint64_t>();
        a.v_caches = m.row_v ? vp.as<const uint64_t>() : nullptr;
        a.page_table = table.as<const int32_t>();
        a.max_pages_per_req = in.max_pages_per_req;
        a.kv_lens = kv_lens.as<const int32_t>();
        a.node_counts = counts.as<const int32_t>();
        a.accepted_path = path.as<const int32_t>();
        a.accept_lens = lens.as<const int32_t>();
        a.error_flags = flags.as<int32_t>();
        a.stream = stream;
        const double us = median_us(stream, o.iters, [&] { check(kdtree_kv_compact(rt, &a), "kdtree_kv_compact"); });
        check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize");
        const int error_flags = flags.download<int32_t>(1)[0];

        const long long rows_moved = moved * layers * (m.row_v ? 2 : 1);
        const double bytes = double(moved) * layers * (m.row_k + m.row_v) * 2.0 * 2.0;  // read + write
        const double gbps = bytes / (us * 1e3);
        std::printf("%9s %3d %4d | %11lld | %10.2f %9.1f %6.1f%% | %d\n", m.name, B, W, rows_moved, us, gbps,
                    100.0 * gbps / o.hbm_gbps, error_flags);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"kv_compact\",\"sm\":%d,\"model\":\"%s\",\"layers\":%d,\"page_size\":%d,\"B\":%d,"
                      "\"W\":%d,\"rows_moved\":%lld,\"bytes\":%.0f,\"median_us\":%.3f,\"gb_per_s\":%.1f,"
                      "\"fraction_of_hbm\":%.4f,\"error_flags\":%d}",
                      sm, m.name, layers, page, B, W, rows_moved, bytes, us, gbps, gbps / o.hbm_gbps, error_flags);
        json.emplace_back(line);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (!kdtree::bench::gpu_available("bench_sample_compact")) return 0;
  kdtree::bench::Session gpu;
  std::printf("kdtree %s, sm_%d, median of %d calls after warm-up (per-call CUDA events)\n", kdtree_version(), gpu.sm,
              o.iters);

  std::vector<std::string> json;
  bench_sample(gpu.rt, gpu.stream, gpu.sm, o, json);
  bench_compact(gpu.rt, gpu.stream, gpu.sm, o, json);
  std::printf("\n");
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  return 0;
}
