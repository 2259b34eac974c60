#include "reference/tree_allocate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "kdtree/kdtree.h"

namespace kdtree::ref {

TreeAllocateOutput tree_allocate(const TreeAllocateInput& in) {
  const int B = in.batch_size, W = in.max_tree_nodes, cap = in.cap;
  if (B < 1 || W < 2 || cap < 1 || cap >= W || in.total < 0 || in.total > (long long)B * cap ||
      in.scores.size() != size_t(B) * W || (!in.active.empty() && in.active.size() != size_t(B)) ||
      (!in.remaining.empty() && in.remaining.size() != size_t(B))) {
    throw std::invalid_argument(
        "ref::tree_allocate: scores must be [B, W], active and remaining [B] or empty, "
        "1 <= cap < W and 0 <= total <= B * cap");
  }
  std::vector<float> weight(B, 0.0f);
  if (!in.remaining.empty()) {
    int most = 1;
    for (int r : in.remaining) most = std::max(most, r);
    for (int b = 0; b < B; ++b) {
      weight[b] = in.urgency * std::log(std::max(float(in.remaining[b]), 1.0f) / float(most));
    }
  }
  TreeAllocateOutput out;
  out.keys.resize(size_t(B) * cap);
  bool bad = false;
  for (int b = 0; b < B; ++b) {
    const float offset = (!in.active.empty() && !in.active[b]) ? 1.0e6f : 0.0f;
    for (int j = 0; j < cap; ++j) {
      const float k = (in.scores[size_t(b) * W + 1 + j] + weight[b]) - offset;
      out.keys[size_t(b) * cap + j] = k;
      bad = bad || std::isnan(k) || (j > 0 && !(out.keys[size_t(b) * cap + j - 1] >= k));
    }
  }
  std::vector<int32_t> counts(B, 1);
  if (bad) {
    out.error_flags = KDTREE_DEVICE_ERROR_SCORES;
  } else {
    std::vector<size_t> order(size_t(B) * cap);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return out.keys[x] > out.keys[y]; });
    for (int i = 0; i < in.total; ++i) ++counts[order[i] / cap];
  }
  const size_t rows = size_t(B) + in.total;
  out.node_counts = counts;
  out.node_indptr.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) out.node_indptr[b + 1] = out.node_indptr[b] + counts[b];
  out.row_req.assign(rows, 0);
  out.row_node.assign(rows, 0);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < counts[b]; ++i) {
      out.row_req[out.node_indptr[b] + i] = b;
      out.row_node[out.node_indptr[b] + i] = i;
    }
  }
  return out;
}

AllocationSpan allocation_span(const TreeAllocateOutput& ref, int cap, const std::vector<int32_t>& counts) {
  AllocationSpan span;
  span.lowest_taken = std::numeric_limits<float>::infinity();
  span.highest_left = -span.lowest_taken;
  span.fewest = std::numeric_limits<int>::max();
  span.most = std::numeric_limits<int>::min();
  for (size_t b = 0; b < counts.size(); ++b) {
    const int n = counts[b] - 1;
    span.drafts += n;
    span.fewest = std::min(span.fewest, n);
    span.most = std::max(span.most, n);
    if (n > 0 && n <= cap) span.lowest_taken = std::min(span.lowest_taken, ref.keys[b * cap + n - 1]);
    if (n >= 0 && n < cap) span.highest_left = std::max(span.highest_left, ref.keys[b * cap + n]);
  }
  return span;
}

}  // namespace kdtree::ref
