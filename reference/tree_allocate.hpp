// CPU reference of tree_allocate: every request's draft nodes 1..cap keyed by
// score + urgency * ln(max(remaining, 1) / the most) (in float32, as the kernel
// and kdtree.integrations.allocate compute it; done requests 1e6 lower), sorted
// (stable, descending, request-major), the first `total` taken. No binary search:
// it sorts, so it does not rest on the scores' order that the kernel needs; that
// order is checked as the kernel checks it.
#pragma once
#include <cstdint>
#include <vector>

namespace kdtree::ref {

struct TreeAllocateInput {
  int batch_size = 0;
  int max_tree_nodes = 0;  // W: the scores' row stride
  int cap = 0;
  int total = 0;
  std::vector<float> scores;       // [B, W]
  std::vector<uint8_t> active;     // [B], or empty = every request active
  std::vector<int32_t> remaining;  // [B], or empty = no weighting
  float urgency = 0.0f;
};

struct TreeAllocateOutput {
  std::vector<int32_t> node_counts;  // [B]
  std::vector<int32_t> node_indptr;  // [B + 1]
  std::vector<int64_t> row_req;      // [B + total]
  std::vector<int64_t> row_node;     // [B + total]
  std::vector<float> keys;           // [B, cap]: each draft node's key, what the choice ranked
  int32_t error_flags = 0;           // KDTREE_DEVICE_ERROR_SCORES or 0
};

// A NaN key, or a key above the one before it in its request: KDTREE_DEVICE_ERROR_SCORES, and every request
// keeps its root only (rows from B on are (0, 0)). Throws std::invalid_argument on wrong sizes or ranges.
TreeAllocateOutput tree_allocate(const TreeAllocateInput& in);

}  // namespace kdtree::ref
