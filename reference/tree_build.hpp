// CPU reference of tree_build (DDTree): best-first expansion with a host
// priority queue, in exactly the order the kernel uses:
//   score descending, then smaller depth, then the lexicographically smaller
//   rank path (ranks packed 6 bits each into a left-aligned 128-bit key).
// Scores are float32 sums root-first (root 0), so CPU and GPU agree bitwise;
// scores are ordered by their order-preserving uint32 image (score_order_key),
// which is the float order for every non-NaN value.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace kdtree::ref {

// Larger float -> larger key; NaNs sort beyond the infinities of their sign.
inline uint32_t score_order_key(float score) {
  uint32_t u;
  std::memcpy(&u, &score, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TreeBuildInput {
  int batch_size = 0;
  int depth = 0;                      // D
  int top_k = 0;                      // K
  int budget = 0;                     // draft nodes to select, 1..W-1
  int max_tree_nodes = 0;             // W
  std::vector<int32_t> draft_tokens;  // [B, D, K]
  std::vector<float> draft_logprobs;  // [B, D, K], descending along K
  std::vector<int32_t> root_tokens;   // [B]
  std::vector<int32_t> prefix_lens;   // [B]
};

// The outputs of kdtree_tree_build, in its padded layout.
struct TreeBuildOutput {
  int mask_words = 0;                 // ceil(W / 64)
  std::vector<int32_t> tokens;        // [B, W], -1 past the count
  std::vector<int32_t> parents;       // [B, W], root -1
  std::vector<int32_t> depths;        // [B, W]
  std::vector<int32_t> positions;     // [B, W]
  std::vector<uint64_t> tree_mask;    // [B, W, mask_words], 0 past the count
  std::vector<int32_t> first_child;   // [B, W]
  std::vector<int32_t> next_sibling;  // [B, W]
  std::vector<int32_t> node_counts;   // [B]
  std::vector<float> scores;          // [B, W], -inf past the count
};

// Throws std::invalid_argument on inconsistent sizes or out-of-range values.
TreeBuildOutput tree_build(const TreeBuildInput& in);

}  // namespace kdtree::ref
