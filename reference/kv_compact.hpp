// CPU reference of kv_compact on host copies of the caches: per request, path
// entry j (node n_j) moves from logical position prefix + n_j to prefix + j,
// prefix = kv_len - n_b, through the page table. Entries are copied in path order,
// which is safe in place (a destination is only ever an earlier entry's source).
// Malformed requests are skipped and reported with KDTREE_DEVICE_ERROR_* bits,
// exactly as the kernel does.
#pragma once
#include <cstdint>
#include <vector>

namespace kdtree::ref {

struct KvCompactInput {
  int batch_size = 0;
  int max_tree_nodes = 0;  // W: row stride of accepted_path
  int page_size = 0;
  int num_pages = 0;
  int max_pages_per_req = 0;
  std::vector<int32_t> page_table;     // [B, max_pages_per_req]
  std::vector<int32_t> kv_lens;        // [B]
  std::vector<int32_t> node_counts;    // [B]
  std::vector<int32_t> accepted_path;  // [B, W]
  std::vector<int32_t> accept_lens;    // [B]
};

// KDTREE_DEVICE_ERROR_* bits of request b (0 = valid).
int kv_compact_request_errors(const KvCompactInput& in, int b);

// Rows request b moves per cache (0 when it is malformed).
int kv_compact_moved_rows(const KvCompactInput& in, int b);

// Compacts one cache [num_pages, page_size, row_elems] of 16-bit elements in
// place; returns the OR of every request's error bits. Throws
// std::invalid_argument on inconsistent sizes.
int kv_compact(const KvCompactInput& in, std::vector<uint16_t>& cache, int row_elems);
// The same for a cache of e4m3 (1-byte) elements: rows move as bytes either way.
int kv_compact(const KvCompactInput& in, std::vector<uint8_t>& cache, int row_elems);

}  // namespace kdtree::ref
