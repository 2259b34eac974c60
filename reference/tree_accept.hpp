// CPU reference of tree_accept: walk from the root, each step to the lowest-index
// child whose token equals the target's token at the current node, as deep as it
// goes. Malformed requests get the kernel's device error bits and -1 outputs.
#pragma once
#include <cstdint>
#include <vector>

namespace kdtree::ref {

struct TreeAcceptInput {
  int batch_size = 0;
  int max_tree_nodes = 0;              // W
  std::vector<int32_t> tokens;         // [B, W]
  std::vector<int32_t> parents;        // [B, W]
  std::vector<int32_t> node_counts;    // [B]
  std::vector<int32_t> target_tokens;  // [B, W] padded, or packed with node_indptr
  std::vector<int32_t> node_indptr;    // [B + 1], or empty = padded targets
};

struct TreeAcceptOutput {
  std::vector<int32_t> accepted_path;   // [B, W], root first, -1 padded
  std::vector<int32_t> accept_lens;     // [B]: path length - 1 (-1 for a malformed request)
  std::vector<int32_t> bonus_tokens;    // [B] (-1 for a malformed request)
  int32_t error_flags = 0;              // KDTREE_DEVICE_ERROR_* bits, OR of all requests
  std::vector<int32_t> request_errors;  // [B]: the bits of each request
};

// Device-side checks, in the kernel's order: node count in 1..W (and, packed,
// node_indptr[b] >= 0, node_indptr[b+1] - node_indptr[b] == count and
// node_indptr[b+1] <= total_nodes, here target_tokens.size()) ->
// KDTREE_DEVICE_ERROR_NODE_COUNT; else parents[0] == -1 and 0 <= parents[i] < i
// -> KDTREE_DEVICE_ERROR_TREE. Throws std::invalid_argument on wrong vector sizes.
TreeAcceptOutput tree_accept(const TreeAcceptInput& in);

}  // namespace kdtree::ref
