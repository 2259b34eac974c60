#include "reference/tree_accept.hpp"

#include <stdexcept>

#include "kdtree/kdtree.h"

namespace kdtree::ref {

TreeAcceptOutput tree_accept(const TreeAcceptInput& in) {
  const int B = in.batch_size, W = in.max_tree_nodes;
  const size_t rows = size_t(B) * W;
  if (B < 1 || W < 1 || in.tokens.size() != rows || in.parents.size() != rows || in.node_counts.size() != size_t(B)) {
    throw std::invalid_argument("ref::tree_accept: tokens/parents must be [B, W] and node_counts [B]");
  }
  const bool packed = !in.node_indptr.empty();
  if (packed ? in.node_indptr.size() != size_t(B) + 1 : in.target_tokens.size() != rows) {
    throw std::invalid_argument("ref::tree_accept: node_indptr must be [B + 1] or empty (targets [B, W])");
  }

  TreeAcceptOutput out;
  out.accepted_path.assign(rows, -1);
  out.accept_lens.assign(B, -1);
  out.bonus_tokens.assign(B, -1);
  out.request_errors.assign(B, 0);
  for (int b = 0; b < B; ++b) {
    const size_t base = size_t(b) * W;
    const int n = in.node_counts[b];
    int error = 0;
    long long target_base = (long long)base;
    if (n < 1 || n > W) {
      error = KDTREE_DEVICE_ERROR_NODE_COUNT;
    } else if (packed) {
      target_base = in.node_indptr[b];
      const long long begin = in.node_indptr[b], end = in.node_indptr[b + 1];
      // The packed targets are [total_nodes] = target_tokens.size(): a segment past them is the caller's error.
      if (begin < 0 || end - begin != n || end > (long long)in.target_tokens.size()) {
        error = KDTREE_DEVICE_ERROR_NODE_COUNT;
      }
    }
    if (!error) {
      for (int i = 0; i < n; ++i) {
        const int p = in.parents[base + i];
        if (i == 0 ? p != -1 : (p < 0 || p >= i)) error = KDTREE_DEVICE_ERROR_TREE;
      }
    }
    if (error) {
      out.request_errors[b] = error;
      out.error_flags |= error;
      continue;
    }
    auto target = [&](int i) { return in.target_tokens[size_t(target_base + i)]; };
    int cur = 0, length = 0;
    out.accepted_path[base + length++] = 0;
    for (;;) {
      int next = -1;
      for (int j = cur + 1; j < n; ++j) {  // children come after their parent
        if (in.parents[base + j] == cur && in.tokens[base + j] == target(cur)) {
          next = j;
          break;
        }
      }
      if (next < 0) break;
      out.accepted_path[base + length++] = next;
      cur = next;
    }
    out.accept_lens[b] = length - 1;
    out.bonus_tokens[b] = target(cur);
  }
  return out;
}

}  // namespace kdtree::ref
