// kv_compact on the GPU against the CPU reference: every layer's caches are
// compared bit for bit (moved rows and everything that must stay untouched),
// on hand-worked paths, random batches with scattered pages, and malformed
// requests (flagged in error_flags and skipped).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/kv_compact.hpp"
#include "runtime/tree_ops.hpp"
#include "tests/support/device.hpp"
#include "tests/support/gpu_fixture.hpp"

using kdtree::ref::KvCompactInput;
using kdtree::test::DeviceBuffer;
using kdtree::test::Gpu;

namespace {

const char* const kTempDir = "kdtree-kv-compact-gpu";

// A problem plus random per-layer caches (K, and V unless MLA): 16-bit (k, v)
// or, with fp8, e4m3 bytes (k8, v8; row_k and row_v count bytes then).
struct Problem {
  KvCompactInput in;
  int num_layers = 1;
  int row_k = 576, row_v = 0;
  bool fp8 = false;
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<std::vector<uint8_t>> k8, v8;

  void fill_caches(std::mt19937_64& rng) {
    const size_t rows = static_cast<size_t>(in.num_pages) * in.page_size;
    if (fp8) {
      k8.assign(num_layers, std::vector<uint8_t>(rows * row_k));
      v8.assign(row_v ? num_layers : 0, std::vector<uint8_t>(rows * row_v));
      for (auto& c : k8)
        for (auto& x : c) x = static_cast<uint8_t>(rng());
      for (auto& c : v8)
        for (auto& x : c) x = static_cast<uint8_t>(rng());
      return;
    }
    k.assign(num_layers, std::vector<uint16_t>(rows * row_k));
    v.assign(row_v ? num_layers : 0, std::vector<uint16_t>(rows * row_v));
    for (auto& c : k)
      for (auto& x : c) x = static_cast<uint16_t>(rng());
    for (auto& c : v)
      for (auto& x : c) x = static_cast<uint16_t>(rng());
  }
};

template <typename T>
void upload_caches(std::vector<std::vector<T>>& caches, std::vector<DeviceBuffer>* bufs, std::vector<uint64_t>* ptrs) {
  for (auto& c : caches) {
    bufs->emplace_back(c);
    ptrs->push_back(bufs->back().ptr());
  }
}

// Every layer's cache against the reference; returns the reference's error bits.
template <typename T>
int check_caches(const KvCompactInput& in, std::vector<std::vector<T>>& caches, int row,
                 const std::vector<DeviceBuffer>& bufs, const char* which) {
  int expected = 0;
  for (size_t l = 0; l < caches.size(); ++l) {
    expected = kdtree::ref::kv_compact(in, caches[l], row);
    INFO("layer ", l, " ", which);
    CHECK(bufs[l].download<T>() == caches[l]);
  }
  return expected;
}

// Runs the kernel; returns error_flags (error_flags NULL when !with_flags) and
// checks every cache against the reference.
int run_and_check(kdtree::Engine& rt, Problem& pb, bool with_flags = true) {
  std::vector<DeviceBuffer> kd, vd;
  std::vector<uint64_t> kp, vp;
  if (pb.fp8) {
    upload_caches(pb.k8, &kd, &kp);
    upload_caches(pb.v8, &vd, &vp);
  } else {
    upload_caches(pb.k, &kd, &kp);
    upload_caches(pb.v, &vd, &vp);
  }
  DeviceBuffer k_ptrs(kp), v_ptrs;
  if (!vp.empty()) v_ptrs = DeviceBuffer(vp);
  DeviceBuffer table(pb.in.page_table), kv_lens(pb.in.kv_lens), counts(pb.in.node_counts), path(pb.in.accepted_path),
      accept(pb.in.accept_lens), flags(std::vector<int32_t>{0});

  kdtree_kv_compact_args a{};
  a.num_layers = pb.num_layers;
  a.batch_size = pb.in.batch_size;
  a.max_tree_nodes = pb.in.max_tree_nodes;
  a.page_size = pb.in.page_size;
  a.num_pages = pb.in.num_pages;
  a.row_elems_k = pb.row_k;
  a.row_elems_v = pb.row_v;
  a.dtype = KDTREE_DTYPE_BF16;
  a.kv_dtype = pb.fp8 ? KDTREE_KV_DTYPE_E4M3 : KDTREE_KV_DTYPE_AS_Q;
  a.k_caches = k_ptrs.get<const uint64_t>();
  a.v_caches = vp.empty() ? nullptr : v_ptrs.get<const uint64_t>();
  a.page_table = table.get<const int32_t>();
  a.max_pages_per_req = pb.in.max_pages_per_req;
  a.kv_lens = kv_lens.get<const int32_t>();
  a.node_counts = counts.get<const int32_t>();
  a.accepted_path = path.get<const int32_t>();
  a.accept_lens = accept.get<const int32_t>();
  a.error_flags = with_flags ? flags.get<int32_t>() : nullptr;
  kdtree::kv_compact(rt, a);

  const int expected_flags =
      pb.fp8 ? check_caches(pb.in, pb.k8, pb.row_k, kd, "K") : check_caches(pb.in, pb.k, pb.row_k, kd, "K");
  if (pb.fp8) {
    check_caches(pb.in, pb.v8, pb.row_v, vd, "V");
  } else {
    check_caches(pb.in, pb.v, pb.row_v, vd, "V");
  }
  const int got = flags.download<int32_t>()[0];
  if (with_flags) CHECK(got == expected_flags);
  return got;
}

// One request with a reversed, spread-out page table.
Problem one_request(int page_size, int W, int kv_len, int n, std::vector<int32_t> path) {
  Problem pb;
  pb.in.batch_size = 1;
  pb.in.max_tree_nodes = W;
  pb.in.page_size = page_size;
  pb.in.max_pages_per_req = (kv_len + page_size - 1) / page_size;
  pb.in.num_pages = 2 * pb.in.max_pages_per_req + 1;
  for (int p = 0; p < pb.in.max_pages_per_req; ++p) pb.in.page_table.push_back(pb.in.num_pages - 1 - 2 * p);
  pb.in.kv_lens = {kv_len};
  pb.in.node_counts = {n};
  pb.in.accept_lens = {static_cast<int32_t>(path.size()) - 1};
  path.resize(W, -1);
  pb.in.accepted_path = path;
  return pb;
}

// A random batch: node counts up to W, prefixes up to 300, random increasing
// paths (every node kept with probability `keep`), pages shuffled over a pool
// larger than needed.
Problem random_batch(std::mt19937_64& rng, int B, int W, int page_size, int layers, int row_k, int row_v, double keep,
                     bool fp8 = false) {
  Problem pb;
  pb.fp8 = fp8;
  pb.num_layers = layers;
  pb.row_k = row_k;
  pb.row_v = row_v;
  pb.in.batch_size = B;
  pb.in.max_tree_nodes = W;
  pb.in.page_size = page_size;
  pb.in.max_pages_per_req = (300 + W + page_size - 1) / page_size + 1;
  pb.in.num_pages = B * pb.in.max_pages_per_req + 7;
  std::vector<int32_t> pages(static_cast<size_t>(pb.in.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(static_cast<size_t>(B) * pb.in.max_pages_per_req);
  pb.in.page_table = pages;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int b = 0; b < B; ++b) {
    const int n = 1 + static_cast<int>(rng() % W);
    pb.in.node_counts.push_back(n);
    pb.in.kv_lens.push_back(n + static_cast<int>(rng() % 300));
    std::vector<int32_t> path{0};
    for (int node = 1; node < n; ++node) {
      if (coin(rng) < keep) path.push_back(node);
    }
    pb.in.accept_lens.push_back(static_cast<int32_t>(path.size()) - 1);
    path.resize(W, -1);
    pb.in.accepted_path.insert(pb.in.accepted_path.end(), path.begin(), path.end());
  }
  pb.fill_caches(rng);
  return pb;
}

}  // namespace

TEST_CASE("kv_compact GPU: path [0 2 3] in place - page sizes 1 and 16") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(1);
  for (int page_size : {1, 16}) {
    INFO("kv_compact[W=16,page=", page_size, "] MLA, path [0,2,3]");
    Problem pb = one_request(page_size, 16, 8 + 3 * page_size, 5, {0, 2, 3});
    pb.num_layers = 2;
    pb.fill_caches(rng);
    const std::vector<uint16_t> before = pb.k[0];
    run_and_check(gpu.rt, pb);
    CHECK(pb.k[0] != before);  // something moved
  }
  // GQA, page 16, the move crosses a page boundary: prefix 14, nodes at 14..19.
  INFO("kv_compact[W=16,page=16] GQA, path [0,1,3,5]");
  Problem pb = one_request(16, 16, 20, 6, {0, 1, 3, 5});
  pb.num_layers = 3;
  pb.row_k = 1024;
  pb.row_v = 1024;
  pb.fill_caches(rng);
  run_and_check(gpu.rt, pb);
}

TEST_CASE("kv_compact GPU: random batches - scattered pages - MLA and GQA") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(0xc0ffee);
  for (int W : {16, 64, 128}) {
    for (int page_size : {1, 16, 64}) {
      for (bool mla : {true, false}) {
        for (double keep : {0.3, 0.9}) {
          const int row_k = mla ? 576 : 2 * 128, row_v = mla ? 0 : 2 * 128;
          INFO("kv_compact[W=", W, ",page=", page_size, "] ", mla ? "MLA 576" : "GQA 2x128",
               ", B=7, layers=3, keep=", keep);
          Problem pb = random_batch(rng, 7, W, page_size, 3, row_k, row_v, keep);
          run_and_check(gpu.rt, pb);
        }
      }
    }
  }
  // Small rows (one partial chunk) and a row of many chunks.
  for (int row : {8, 72, 2048}) {
    INFO("kv_compact[W=32,page=16] row ", row);
    Problem pb = random_batch(rng, 4, 32, 16, 2, row, row, 0.5);
    run_and_check(gpu.rt, pb);
  }
}

// e4m3 rows: MLA's 576-byte row (36 vectors: one full chunk and a partial one)
// and GQA rows of num_kv_heads x 64/128/256 bytes, every layer in one launch.
TEST_CASE("kv_compact GPU: e4m3 rows - MLA 576 bytes and GQA 64/128/256 bytes") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(0xf8);
  for (int W : {16, 64, 128}) {
    for (int page_size : {1, 16, 64}) {
      for (int head : {576, 64, 128, 256}) {
        const bool mla = head == 576;
        const int row_k = mla ? 576 : 2 * head, row_v = mla ? 0 : 2 * head;
        INFO("kv_compact[W=", W, ",page=", page_size, ",kv=e4m3] ", mla ? "MLA 576" : "GQA 2x", head,
             " bytes, B=5, layers=3");
        Problem pb = random_batch(rng, 5, W, page_size, 3, row_k, row_v, 0.6, true);
        run_and_check(gpu.rt, pb);
      }
    }
  }
  // One KV head of 64: a 64-byte row, less than a chunk.
  INFO("kv_compact[W=32,page=16,kv=e4m3] GQA 1x64 bytes");
  Problem pb = random_batch(rng, 4, 32, 16, 2, 64, 64, 0.5, true);
  run_and_check(gpu.rt, pb);
}

TEST_CASE("kv_compact GPU: a path longer than one read-then-write round") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(3);
  // Nodes 0, 2, 3, ..., 127: 126 entries move, each onto its predecessor's source.
  std::vector<int32_t> path{0};
  for (int node = 2; node < 128; ++node) path.push_back(node);
  for (int page_size : {1, 16, 128}) {
    INFO("kv_compact[W=128,page=", page_size, "] accept 126");
    Problem pb = one_request(page_size, 128, 400, 128, path);
    pb.num_layers = 2;
    pb.row_k = 576;
    pb.fill_caches(rng);
    run_and_check(gpu.rt, pb);
  }
}

TEST_CASE("kv_compact GPU: malformed requests are flagged and skipped - valid ones still move") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(11);
  struct Bad {
    const char* name;
    int flag;
    void (*apply)(KvCompactInput&, int b);
  };
  const Bad cases[] = {
      {"n_b = 0", KDTREE_DEVICE_ERROR_NODE_COUNT, [](KvCompactInput& in, int b) { in.node_counts[b] = 0; }},
      {"n_b > W", KDTREE_DEVICE_ERROR_NODE_COUNT,
       [](KvCompactInput& in, int b) { in.node_counts[b] = in.max_tree_nodes + 1; }},
      {"kv_len < n_b", KDTREE_DEVICE_ERROR_NODE_COUNT,
       [](KvCompactInput& in, int b) { in.kv_lens[b] = in.node_counts[b] - 1; }},
      {"kv_len beyond the page table", KDTREE_DEVICE_ERROR_KV_LEN,
       [](KvCompactInput& in, int b) { in.kv_lens[b] = in.max_pages_per_req * in.page_size + 1; }},
      {"accept_len < 0", KDTREE_DEVICE_ERROR_PATH, [](KvCompactInput& in, int b) { in.accept_lens[b] = -1; }},
      {"accept_len >= n_b", KDTREE_DEVICE_ERROR_PATH,
       [](KvCompactInput& in, int b) { in.accept_lens[b] = in.node_counts[b]; }},
      {"path[0] != 0", KDTREE_DEVICE_ERROR_PATH,
       [](KvCompactInput& in, int b) { in.accepted_path[size_t(b) * in.max_tree_nodes] = 1; }},
      {"path not increasing", KDTREE_DEVICE_ERROR_PATH,
       [](KvCompactInput& in, int b) {
         int32_t* p = &in.accepted_path[size_t(b) * in.max_tree_nodes];
         p[2] = p[1];
       }},
      {"node id >= n_b", KDTREE_DEVICE_ERROR_PATH,
       [](KvCompactInput& in, int b) {
         in.accepted_path[size_t(b) * in.max_tree_nodes + in.accept_lens[b]] = in.node_counts[b];
       }},
      {"page id out of range", KDTREE_DEVICE_ERROR_PAGE_INDEX,
       [](KvCompactInput& in, int b) {
         const int pos = in.kv_lens[b] - in.node_counts[b] + 1;  // the first destination
         in.page_table[size_t(b) * in.max_pages_per_req + pos / in.page_size] = in.num_pages;
       }},
      {"negative page id", KDTREE_DEVICE_ERROR_PAGE_INDEX,
       [](KvCompactInput& in, int b) {  // the page of the last source
         const int pos =
             in.kv_lens[b] - in.node_counts[b] + in.accepted_path[size_t(b) * in.max_tree_nodes + in.accept_lens[b]];
         in.page_table[size_t(b) * in.max_pages_per_req + pos / in.page_size] = -1;
       }},
  };
  for (const Bad& bad : cases) {
    for (bool with_flags : {true, false}) {
      INFO("kv_compact[W=32,page=16]: ", bad.name, with_flags ? "" : " (error_flags NULL)");
      // Request 1 gets a path with at least 3 entries, the last one moved, so every corruption applies.
      Problem pb = random_batch(rng, 3, 32, 16, 2, 576, 0, 0.5);
      pb.in.node_counts[1] = 20;
      pb.in.kv_lens[1] = 20 + 37;
      std::vector<int32_t> path = {0, 3, 7, 19};
      std::copy(path.begin(), path.end(), pb.in.accepted_path.begin() + 32);
      pb.in.accept_lens[1] = 3;
      bad.apply(pb.in, 1);
      REQUIRE(kdtree::ref::kv_compact_request_errors(pb.in, 1) == bad.flag);
      const int flags = run_and_check(gpu.rt, pb, with_flags);
      if (with_flags) CHECK(flags == bad.flag);
    }
  }
}
