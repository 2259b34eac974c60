// The kv_compact CPU reference: hand-worked moves through scattered pages, the
// in-place order against an out-of-place copy, and every malformed-input bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/kv_compact.hpp"

using kdtree::ref::KvCompactInput;

namespace {

// One request whose logical pages map to a reversed, scattered set of physical
// pages; every row holds its physical row index in every element.
struct OneRequest {
  KvCompactInput in;
  int row_elems = 8;
  std::vector<uint16_t> cache;

  OneRequest(int page_size, int W, int kv_len, int n, std::vector<int32_t> path) {
    in.batch_size = 1;
    in.max_tree_nodes = W;
    in.page_size = page_size;
    in.max_pages_per_req = (kv_len + page_size - 1) / page_size;
    in.num_pages = 2 * in.max_pages_per_req + 1;
    for (int p = 0; p < in.max_pages_per_req; ++p) in.page_table.push_back(in.num_pages - 1 - 2 * p);
    in.kv_lens = {kv_len};
    in.node_counts = {n};
    in.accept_lens = {static_cast<int32_t>(path.size()) - 1};
    path.resize(W, -1);
    in.accepted_path = path;
    cache.resize(static_cast<size_t>(in.num_pages) * page_size * row_elems);
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<uint16_t>(i / row_elems);
  }
  // Physical row of logical position `pos`.
  int row(int pos) const { return in.page_table[pos / in.page_size] * in.page_size + pos % in.page_size; }
  uint16_t at(int pos) const { return cache[static_cast<size_t>(row(pos)) * row_elems]; }
};

// Reads every source before writing: what the in-place reference must equal.
std::vector<uint16_t> out_of_place(const KvCompactInput& in, const std::vector<uint16_t>& cache, int row_elems) {
  std::vector<uint16_t> out = cache;
  for (int b = 0; b < in.batch_size; ++b) {
    if (kdtree::ref::kv_compact_request_errors(in, b) != 0) continue;
    const int prefix = in.kv_lens[b] - in.node_counts[b];
    auto row = [&](int pos) {
      return static_cast<size_t>(in.page_table[static_cast<size_t>(b) * in.max_pages_per_req + pos / in.page_size]) *
                 in.page_size +
             pos % in.page_size;
    };
    for (int j = 0; j <= in.accept_lens[b]; ++j) {
      const int node = in.accepted_path[static_cast<size_t>(b) * in.max_tree_nodes + j];
      std::copy_n(cache.begin() + row(prefix + node) * row_elems, row_elems, out.begin() + row(prefix + j) * row_elems);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("kv_compact reference: path [0 2 3] - destination 2 is entry 1's source (page 1)") {
  // prefix 3, tree nodes at positions 3..7.
  OneRequest r(1, 16, 8, 5, {0, 2, 3});
  const std::vector<uint16_t> before = r.cache;
  std::vector<uint16_t> old(8);
  for (int pos = 0; pos < 8; ++pos) old[pos] = r.at(pos);
  CHECK(kdtree::ref::kv_compact(r.in, r.cache, r.row_elems) == 0);
  CHECK(kdtree::ref::kv_compact_moved_rows(r.in, 0) == 2);
  CHECK(r.at(3) == old[3]);  // root stays
  CHECK(r.at(4) == old[5]);  // node 2 -> slot 1
  CHECK(r.at(5) == old[6]);  // node 3 -> slot 2 (node 2's old place)
  CHECK(r.at(6) == old[6]);  // past the path: untouched
  CHECK(r.at(7) == old[7]);
  for (int pos = 0; pos < 3; ++pos) CHECK(r.at(pos) == old[pos]);
  // Every element of a moved row moved, and nothing else changed.
  size_t changed = 0;
  for (size_t i = 0; i < r.cache.size(); ++i) changed += r.cache[i] != before[i];
  CHECK(changed == size_t(2 * r.row_elems));
}

TEST_CASE("kv_compact reference: page 16 - moves across a page boundary") {
  // prefix 14: nodes 0..5 at positions 14..19 on logical pages 0 and 1.
  OneRequest r(16, 16, 20, 6, {0, 1, 3, 5});
  std::vector<uint16_t> old(20);
  for (int pos = 0; pos < 20; ++pos) old[pos] = r.at(pos);
  CHECK(kdtree::ref::kv_compact(r.in, r.cache, r.row_elems) == 0);
  CHECK(kdtree::ref::kv_compact_moved_rows(r.in, 0) == 2);
  CHECK(r.at(14) == old[14]);
  CHECK(r.at(15) == old[15]);  // node 1 already in place
  CHECK(r.at(16) == old[17]);  // node 3
  CHECK(r.at(17) == old[19]);  // node 5
  CHECK(r.at(18) == old[18]);
  CHECK(r.at(19) == old[19]);
}

TEST_CASE("kv_compact reference: nothing moves for a root-only or in-place path") {
  for (auto path : {std::vector<int32_t>{0}, std::vector<int32_t>{0, 1, 2}}) {
    OneRequest r(16, 32, 40, 10, path);
    const std::vector<uint16_t> before = r.cache;
    CHECK(kdtree::ref::kv_compact(r.in, r.cache, r.row_elems) == 0);
    CHECK(kdtree::ref::kv_compact_moved_rows(r.in, 0) == 0);
    CHECK(r.cache == before);
  }
}

TEST_CASE("kv_compact reference: in place equals out of place on random batches") {
  std::mt19937 rng(7);
  for (int page_size : {1, 16, 64}) {
    for (int W : {16, 64}) {
      KvCompactInput in;
      in.batch_size = 5;
      in.max_tree_nodes = W;
      in.page_size = page_size;
      in.max_pages_per_req = (300 + W + page_size - 1) / page_size;
      in.num_pages = in.batch_size * in.max_pages_per_req;
      std::vector<int32_t> pages(static_cast<size_t>(in.num_pages));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      in.page_table = pages;
      for (int b = 0; b < in.batch_size; ++b) {
        const int n = 1 + int(rng() % W);
        in.node_counts.push_back(n);
        in.kv_lens.push_back(n + int(rng() % 300));
        // A random strictly increasing path from the root.
        std::vector<int32_t> path{0};
        for (int node = 1; node < n; ++node) {
          if (rng() % 3 == 0) path.push_back(node);
        }
        in.accept_lens.push_back(static_cast<int32_t>(path.size()) - 1);
        path.resize(W, -1);
        in.accepted_path.insert(in.accepted_path.end(), path.begin(), path.end());
      }
      const int row_elems = 16;
      std::vector<uint16_t> cache(static_cast<size_t>(in.num_pages) * page_size * row_elems);
      for (auto& x : cache) x = static_cast<uint16_t>(rng());
      const std::vector<uint16_t> expected = out_of_place(in, cache, row_elems);
      INFO("kv_compact[W=", W, ",page=", page_size, ",B=5]");
      // The e4m3 (byte) overload moves the same rows: each 16-bit row is two
      // bytes per element, so the byte cache must end as the 16-bit one's bytes.
      std::vector<uint8_t> bytes(cache.size() * 2);
      std::memcpy(bytes.data(), cache.data(), bytes.size());
      CHECK(kdtree::ref::kv_compact(in, cache, row_elems) == 0);
      CHECK(cache == expected);
      CHECK(kdtree::ref::kv_compact(in, bytes, row_elems * 2) == 0);
      std::vector<uint8_t> expected_bytes(bytes.size());
      std::memcpy(expected_bytes.data(), expected.data(), expected_bytes.size());
      CHECK(bytes == expected_bytes);
    }
  }
}

TEST_CASE("kv_compact reference: malformed requests are flagged and left untouched") {
  struct Case {
    const char* name;
    int kv_len, n;
    std::vector<int32_t> path;
    int accept_len_override;  // -100 = path length - 1
    int bad_page;             // logical page to point out of range, or -1
    int expected;
  };
  const std::vector<Case> cases = {
      {"n_b = 0", 10, 0, {0}, -100, -1, KDTREE_DEVICE_ERROR_NODE_COUNT},
      {"n_b > W", 40, 17, {0, 2}, -100, -1, KDTREE_DEVICE_ERROR_NODE_COUNT},
      {"kv_len < n_b", 4, 5, {0, 2}, -100, -1, KDTREE_DEVICE_ERROR_NODE_COUNT},
      {"kv_len beyond the page table", 33, 5, {0, 2}, -100, -1, KDTREE_DEVICE_ERROR_KV_LEN},
      {"accept_len < 0", 10, 5, {0, 2}, -1, -1, KDTREE_DEVICE_ERROR_PATH},
      {"accept_len = n_b", 10, 5, {0, 1, 2, 3, 4}, 5, -1, KDTREE_DEVICE_ERROR_PATH},
      {"path[0] != 0", 10, 5, {1, 2}, -100, -1, KDTREE_DEVICE_ERROR_PATH},
      {"path not increasing", 10, 5, {0, 3, 2}, -100, -1, KDTREE_DEVICE_ERROR_PATH},
      {"path repeats a node", 10, 5, {0, 2, 2}, -100, -1, KDTREE_DEVICE_ERROR_PATH},
      {"node id >= n_b", 10, 5, {0, 2, 5}, -100, -1, KDTREE_DEVICE_ERROR_PATH},
      {"page id out of range", 10, 5, {0, 2}, -100, 1, KDTREE_DEVICE_ERROR_PAGE_INDEX},
  };
  for (const Case& c : cases) {
    INFO("kv_compact[W=16,page=4]: ", c.name);
    KvCompactInput in;
    in.batch_size = 2;  // request 1 is valid and must still move
    in.max_tree_nodes = 16;
    in.page_size = 4;
    in.max_pages_per_req = 8;
    in.num_pages = 16;
    for (int p = 0; p < 16; ++p) in.page_table.push_back(15 - p);
    if (c.bad_page >= 0) in.page_table[static_cast<size_t>(c.bad_page)] = c.bad_page % 2 ? 16 : -1;
    std::vector<int32_t> path = c.path;
    path.resize(16, -1);
    in.accepted_path = path;
    in.accepted_path.insert(in.accepted_path.end(), {0, 2, 3});
    in.accepted_path.resize(32, -1);
    in.kv_lens = {c.kv_len, 12};
    in.node_counts = {c.n, 6};
    in.accept_lens = {c.accept_len_override == -100 ? static_cast<int32_t>(c.path.size()) - 1 : c.accept_len_override,
                      2};
    const int row_elems = 8;
    std::vector<uint16_t> cache(static_cast<size_t>(in.num_pages) * in.page_size * row_elems);
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<uint16_t>(i);
    std::vector<uint16_t> expected = cache;
    KvCompactInput valid_only = in;  // what request 1 alone does
    valid_only.batch_size = 1;
    valid_only.page_table.erase(valid_only.page_table.begin(), valid_only.page_table.begin() + 8);
    valid_only.accepted_path.erase(valid_only.accepted_path.begin(), valid_only.accepted_path.begin() + 16);
    valid_only.kv_lens.erase(valid_only.kv_lens.begin());
    valid_only.node_counts.erase(valid_only.node_counts.begin());
    valid_only.accept_lens.erase(valid_only.accept_lens.begin());
    CHECK(kdtree::ref::kv_compact(valid_only, expected, row_elems) == 0);

    CHECK(kdtree::ref::kv_compact_request_errors(in, 0) == c.expected);
    CHECK(kdtree::ref::kv_compact(in, cache, row_elems) == c.expected);
    CHECK(cache == expected);
  }
}
