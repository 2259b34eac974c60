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

// What a choice of node counts takes (counts [B]: 1 + each request's draft nodes), read on `ref`'s keys:
// the draft nodes in all, the fewest and the most of one request, the lowest key taken and the highest key
// left (keys past a count outside 0..cap are not read). The tests judge a choice by these: the nodes in all
// equal total, each request within 0..cap, and no node left above one taken.
struct AllocationSpan {
  long long drafts = 0;
  int fewest = 0;
  int most = 0;
  float lowest_taken = 0.0f;  // +inf when nothing is taken
  float highest_left = 0.0f;  // -inf when nothing is left
};
AllocationSpan allocation_span(const TreeAllocateOutput& ref, int cap, const std::vector<int32_t>& counts);

// A NaN key, or a key above the one before it in its request: KDTREE_DEVICE_ERROR_SCORES, and every request
// keeps its root only (rows from B on are (0, 0)). Throws std::invalid_argument on wrong sizes or ranges.
TreeAllocateOutput tree_allocate(const TreeAllocateInput& in);

}  // namespace kdtree::ref
