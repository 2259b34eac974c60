// Host time per call of the C ABI, called from C++: the baseline that the Python
// package's overhead (bench/python_overhead.py) is measured against.
//
// Small shapes, so the GPU never holds the host back: calls are enqueued in
// batches of 100 (the launch queue never fills), the stream is drained between
// batches outside the timed region, and the host time of each batch / 100 is
// one sample. Prints the median per operation and one JSON line each:
//   {"op":"verify_attention","c_abi_us":2.1}
// The shapes match python_overhead.py's: verify_attention MLA 576/512, 16 heads,
// W=16, page 64, one request of 16 nodes over 64 prefix tokens; tree_accept B=4,
// W=16; sample_tokens 4 rows x 1000 f32; kv_compact MLA, 2 layers, B=1, W=16.
//
// usage: bench_host_overhead [--batches N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/bench_support.hpp"
#include "kdtree/kdtree.h"
#include "runtime/driver.hpp"

using kdtree::bench::Buffer;
using kdtree::bench::check;
using kdtree::bench::check_cu;

namespace {

template <typename Call>
double host_us_per_call(CUstream stream, int batches, Call&& call) {
  const int per_batch = 100;
  for (int i = 0; i < 20; ++i) call();  // compile/load, warm up
  std::vector<double> samples;
  for (int b = 0; b < batches; ++b) {
    check_cu(kdtree::driver::api().cuStreamSynchronize(stream), "cuStreamSynchronize");
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per_batch; ++i) call();
    auto t1 = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / per_batch);
  }
  check_cu(kdtree::driver::api().cuStreamSynchronize(stream), "cuStreamSynchronize");
  std::sort(samples.begin(), samples.end());
  return kdtree::bench::median(samples);
}

void zero(const Buffer& b, size_t bytes) { check_cu(kdtree::driver::api().cuMemsetD8(b.ptr, 0, bytes), "cuMemsetD8"); }

}  // namespace

int main(int argc, char** argv) {
  int batches = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--batches") && i + 1 < argc) batches = std::max(1, std::atoi(argv[++i]));
  }
  if (!kdtree::bench::gpu_available("bench_host_overhead")) return 0;
  kdtree::bench::Session s;
  std::vector<std::pair<const char*, double>> results;

  {  // verify_attention
    const int heads = 16, nodes = 16, prefix = 64, page = 64, W = 16, pages = 2;
    Buffer q(size_t(nodes) * heads * 576 * 2), k(size_t(pages) * page * 576 * 2), out(size_t(nodes) * heads * 512 * 2);
    zero(q, size_t(nodes) * heads * 576 * 2);
    zero(k, size_t(pages) * page * 576 * 2);
    std::vector<uint64_t> mask(nodes);
    for (int i = 0; i < nodes; ++i) mask[i] = (uint64_t(1) << (i + 1)) - 1;  // a chain
    Buffer d_mask(mask), indptr(std::vector<int32_t>{0, nodes}), lens(std::vector<int32_t>{prefix + nodes}),
        table(std::vector<int32_t>{0, 1});
    kdtree_verify_args a{};
    a.spec = {576, 512, heads, 1, page, W, KDTREE_DTYPE_BF16};
    a.batch_size = 1;
    a.total_nodes = nodes;
    a.max_kv_len = pages * page;  // as the Python default: max_pages_per_req * page_size
    a.num_pages = pages;
    a.q = q.as<void>();
    a.node_indptr = indptr.as<int32_t>();
    a.k_cache = k.as<void>();
    a.page_table = table.as<int32_t>();
    a.max_pages_per_req = pages;
    a.kv_lens = lens.as<int32_t>();
    a.tree_mask = d_mask.as<uint64_t>();
    a.sm_scale = 0.0416667f;
    a.out = out.as<void>();
    a.stream = s.stream;
    check(kdtree_verify_workspace_size(s.rt, &a.spec, 1, nodes, a.max_kv_len, &a.workspace_size), "workspace size");
    Buffer ws(a.workspace_size);
    a.workspace = a.workspace_size ? ws.as<void>() : nullptr;
    // The launch call only (the Python package caches the workspace size per shape).
    results.push_back({"verify_attention", host_us_per_call(s.stream, batches, [&] {
                         check(kdtree_verify_attention(s.rt, &a), "kdtree_verify_attention");
                       })});
  }
  {  // tree_accept
    const int B = 4, W = 16;
    std::vector<int32_t> parents(B * W), counts(B, W);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < W; ++i) parents[b * W + i] = i - 1;
    Buffer tokens(std::vector<int32_t>(B * W, 1)), d_parents(parents), d_counts(counts),
        targets(std::vector<int32_t>(B * W, 1)), path(B * W * 4), acc(B * 4), bonus(B * 4);
    kdtree_tree_accept_args a{};
    a.batch_size = B;
    a.max_tree_nodes = W;
    a.tokens = tokens.as<int32_t>();
    a.parents = d_parents.as<int32_t>();
    a.node_counts = d_counts.as<int32_t>();
    a.target_tokens = targets.as<int32_t>();
    a.accepted_path = path.as<int32_t>();
    a.accept_lens = acc.as<int32_t>();
    a.bonus_tokens = bonus.as<int32_t>();
    a.stream = s.stream;
    results.push_back({"tree_accept", host_us_per_call(s.stream, batches, [&] {
                         check(kdtree_tree_accept(s.rt, &a), "kdtree_tree_accept");
                       })});
  }
  {  // sample_tokens
    const int rows = 4, vocab = 1000;
    Buffer logits(size_t(rows) * vocab * 4), out(rows * 4);
    zero(logits, size_t(rows) * vocab * 4);
    kdtree_sample_args a{};
    a.num_rows = rows;
    a.vocab_size = vocab;
    a.logits_dtype = KDTREE_DTYPE_F32;
    a.logits = logits.as<void>();
    a.temperature = 0.8f;
    a.seed = 1;
    a.out_tokens = out.as<int32_t>();
    a.stream = s.stream;
    results.push_back({"sample_tokens", host_us_per_call(s.stream, batches, [&] {
                         check(kdtree_sample_tokens(s.rt, &a), "kdtree_sample_tokens");
                       })});
  }
  {  // kv_compact
    const int layers = 2, B = 1, W = 16, page = 64, pages = 2;
    Buffer c0(size_t(pages) * page * 576 * 2), c1(size_t(pages) * page * 576 * 2);
    Buffer ptrs(std::vector<uint64_t>{uint64_t(c0.ptr), uint64_t(c1.ptr)});
    std::vector<int32_t> path(W, -1);
    path[0] = 0;
    path[1] = 2;
    Buffer table(std::vector<int32_t>{0, 1}), lens(std::vector<int32_t>{64 + W}), counts(std::vector<int32_t>{W}),
        d_path(path), acc(std::vector<int32_t>{1});
    kdtree_kv_compact_args a{};
    a.num_layers = layers;
    a.batch_size = B;
    a.max_tree_nodes = W;
    a.page_size = page;
    a.num_pages = pages;
    a.row_elems_k = 576;
    a.dtype = KDTREE_DTYPE_BF16;
    a.k_caches = ptrs.as<uint64_t>();
    a.page_table = table.as<int32_t>();
    a.max_pages_per_req = pages;
    a.kv_lens = lens.as<int32_t>();
    a.node_counts = counts.as<int32_t>();
    a.accepted_path = d_path.as<int32_t>();
    a.accept_lens = acc.as<int32_t>();
    a.stream = s.stream;
    results.push_back({"kv_compact", host_us_per_call(s.stream, batches, [&] {
                         check(kdtree_kv_compact(s.rt, &a), "kdtree_kv_compact");
                       })});
  }
  std::printf("%-18s %12s\n", "op", "C ABI us/call");
  for (auto& [op, us] : results) std::printf("%-18s %12.2f\n", op, us);
  for (auto& [op, us] : results) std::printf("{\"op\":\"%s\",\"c_abi_us\":%.3f}\n", op, us);
  return 0;
}
