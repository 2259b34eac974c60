#include "reference/kv_compact.hpp"

#include <algorithm>
#include <stdexcept>

#include "kdtree/kdtree.h"

namespace kdtree::ref {
namespace {

const int32_t* path_of(const KvCompactInput& in, int b) {
  return in.accepted_path.data() + static_cast<size_t>(b) * static_cast<size_t>(in.max_tree_nodes);
}

// First entry that moves: entries with n_j == j form a prefix of a valid path.
int first_moved(const KvCompactInput& in, int b) {
  const int32_t* path = path_of(in, b);
  int j = 0;
  while (j <= in.accept_lens[b] && path[j] == j) ++j;
  return j;
}

int64_t physical_row(const KvCompactInput& in, int b, int pos) {
  const int page = in.page_table[static_cast<size_t>(b) * in.max_pages_per_req + pos / in.page_size];
  return static_cast<int64_t>(page) * in.page_size + pos % in.page_size;
}

void check_sizes(const KvCompactInput& in) {
  const size_t B = static_cast<size_t>(in.batch_size);
  if (in.batch_size < 0 || in.max_tree_nodes < 1 || in.page_size < 1 || in.max_pages_per_req < 1 ||
      in.page_table.size() != B * in.max_pages_per_req || in.kv_lens.size() != B || in.node_counts.size() != B ||
      in.accepted_path.size() != B * in.max_tree_nodes || in.accept_lens.size() != B) {
    throw std::invalid_argument("kv_compact reference: inconsistent sizes");
  }
}

}  // namespace

int kv_compact_request_errors(const KvCompactInput& in, int b) {
  check_sizes(in);
  const int n = in.node_counts[b], kv_len = in.kv_lens[b], accept = in.accept_lens[b];
  if (n < 1 || n > in.max_tree_nodes || kv_len < n) return KDTREE_DEVICE_ERROR_NODE_COUNT;
  if (static_cast<int64_t>(kv_len) > static_cast<int64_t>(in.max_pages_per_req) * in.page_size) {
    return KDTREE_DEVICE_ERROR_KV_LEN;
  }
  if (accept < 0 || accept > n - 1) return KDTREE_DEVICE_ERROR_PATH;
  const int32_t* path = path_of(in, b);
  if (path[0] != 0) return KDTREE_DEVICE_ERROR_PATH;
  for (int j = 1; j <= accept; ++j) {
    if (path[j] <= path[j - 1] || path[j] >= n) return KDTREE_DEVICE_ERROR_PATH;
  }
  const int first = first_moved(in, b);
  if (first > accept) return 0;
  // Pages of every position a move touches: [prefix + first, prefix + n_accept].
  const int prefix = kv_len - n;
  for (int lp = (prefix + first) / in.page_size; lp <= (prefix + path[accept]) / in.page_size; ++lp) {
    const int page = in.page_table[static_cast<size_t>(b) * in.max_pages_per_req + lp];
    if (page < 0 || page >= in.num_pages) return KDTREE_DEVICE_ERROR_PAGE_INDEX;
  }
  return 0;
}

int kv_compact_moved_rows(const KvCompactInput& in, int b) {
  if (kv_compact_request_errors(in, b) != 0) return 0;
  return in.accept_lens[b] + 1 - first_moved(in, b);
}

namespace {

template <typename T>
int compact_rows(const KvCompactInput& in, std::vector<T>& cache, int row_elems) {
  check_sizes(in);
  if (row_elems < 1 || cache.size() != static_cast<size_t>(in.num_pages) * in.page_size * row_elems) {
    throw std::invalid_argument("kv_compact reference: cache size != num_pages * page_size * row_elems");
  }
  int errors = 0;
  for (int b = 0; b < in.batch_size; ++b) {
    const int bits = kv_compact_request_errors(in, b);
    errors |= bits;
    if (bits != 0) continue;
    const int32_t* path = path_of(in, b);
    const int prefix = in.kv_lens[b] - in.node_counts[b];
    for (int j = first_moved(in, b); j <= in.accept_lens[b]; ++j) {
      const int64_t src = physical_row(in, b, prefix + path[j]) * row_elems;
      const int64_t dst = physical_row(in, b, prefix + j) * row_elems;
      std::copy_n(cache.begin() + src, row_elems, cache.begin() + dst);
    }
  }
  return errors;
}

}  // namespace

int kv_compact(const KvCompactInput& in, std::vector<uint16_t>& cache, int row_elems) {
  return compact_rows(in, cache, row_elems);
}

int kv_compact(const KvCompactInput& in, std::vector<uint8_t>& cache, int row_elems) {
  return compact_rows(in, cache, row_elems);
}

}  // namespace kdtree::ref
