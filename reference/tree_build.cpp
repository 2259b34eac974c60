#include "reference/tree_build.hpp"

#include <cmath>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>

namespace kdtree::ref {
namespace {

// A candidate: rank path (r_1..r_d) packed 6 bits per depth from the top bit.
struct Candidate {
  uint32_t key = 0;  // score_order_key(score)
  float score = 0.0f;
  int depth = 0;
  int rank = 0;
  int parent = 0;  // output index of the parent
  uint64_t path_hi = 0, path_lo = 0;
};

// Sets the 6-bit field of depth d (1-based): bits [128 - 6d, 128 - 6d + 6).
void set_rank(uint64_t& hi, uint64_t& lo, int d, int rank) {
  for (int bit = 0; bit < 6; ++bit) {
    if (!((rank >> bit) & 1)) continue;
    int pos = 128 - 6 * d + bit;
    if (pos >= 64) {
      hi |= uint64_t(1) << (pos - 64);
    } else {
      lo |= uint64_t(1) << pos;
    }
  }
}

// a is popped before b.
bool before(const Candidate& a, const Candidate& b) {
  if (a.key != b.key) return a.key > b.key;
  if (a.depth != b.depth) return a.depth < b.depth;
  if (a.path_hi != b.path_hi) return a.path_hi < b.path_hi;
  return a.path_lo < b.path_lo;
}

struct PoppedLater {
  bool operator()(const Candidate& a, const Candidate& b) const { return before(b, a); }
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("ref::tree_build: " + what);
}

}  // namespace

TreeBuildOutput tree_build(const TreeBuildInput& in) {
  const int B = in.batch_size, D = in.depth, K = in.top_k, W = in.max_tree_nodes;
  check(B >= 1, "batch_size must be >= 1");
  check(D >= 1 && D <= 16, "depth must be 1..16");
  check(K >= 1 && K <= 64, "top_k must be 1..64");
  check(W == 16 || W == 32 || W == 64 || W == 128, "max_tree_nodes must be 16, 32, 64 or 128");
  check(in.budget >= 1 && in.budget <= W - 1, "budget must be 1..W-1");
  const size_t dk = size_t(D) * K;
  check(in.draft_tokens.size() == B * dk && in.draft_logprobs.size() == B * dk, "draft sizes must be B*D*K");
  check(in.root_tokens.size() == size_t(B) && in.prefix_lens.size() == size_t(B), "root/prefix sizes must be B");

  TreeBuildOutput out;
  const int MW = (W + 63) / 64;
  out.mask_words = MW;
  const size_t rows = size_t(B) * W;
  out.tokens.assign(rows, -1);
  out.parents.assign(rows, -1);
  out.depths.assign(rows, -1);
  out.positions.assign(rows, -1);
  out.tree_mask.assign(rows * MW, 0);
  out.first_child.assign(rows, -1);
  out.next_sibling.assign(rows, -1);
  out.node_counts.assign(B, 0);
  out.scores.assign(rows, -std::numeric_limits<float>::infinity());

  for (int b = 0; b < B; ++b) {
    const float* lp = in.draft_logprobs.data() + b * dk;
    const int32_t* tok = in.draft_tokens.data() + b * dk;
    std::vector<Candidate> nodes;  // output order; nodes[0] is the root
    Candidate root;
    nodes.push_back(root);

    std::priority_queue<Candidate, std::vector<Candidate>, PoppedLater> frontier;
    auto push = [&](int parent, int depth, int rank) {
      Candidate c;
      c.parent = parent;
      c.depth = depth;
      c.rank = rank;
      c.score = nodes[parent].score + lp[(depth - 1) * K + rank];  // float32, root first
      c.key = score_order_key(c.score);
      c.path_hi = nodes[parent].path_hi;
      c.path_lo = nodes[parent].path_lo;
      set_rank(c.path_hi, c.path_lo, depth, rank);
      frontier.push(c);
    };
    push(0, 1, 0);
    for (int pops = 0; pops < in.budget && !frontier.empty(); ++pops) {
      Candidate c = frontier.top();
      frontier.pop();
      const int index = int(nodes.size());
      nodes.push_back(c);
      if (c.rank + 1 < K) push(c.parent, c.depth, c.rank + 1);
      if (c.depth < D) push(index, c.depth + 1, 0);
    }

    const int n = int(nodes.size());
    out.node_counts[b] = n;
    const size_t base = size_t(b) * W;
    for (int i = 0; i < n; ++i) {
      const Candidate& c = nodes[i];
      const size_t row = base + i;
      out.tokens[row] = i == 0 ? in.root_tokens[b] : tok[(c.depth - 1) * K + c.rank];
      out.parents[row] = i == 0 ? -1 : c.parent;
      out.depths[row] = c.depth;
      out.positions[row] = in.prefix_lens[b] + c.depth;
      out.scores[row] = c.score;
      if (i > 0) {
        for (int w = 0; w < MW; ++w) out.tree_mask[row * MW + w] = out.tree_mask[(base + c.parent) * MW + w];
      }
      out.tree_mask[row * MW + i / 64] |= uint64_t(1) << (i % 64);
      for (int j = i + 1; j < n; ++j) {
        if (nodes[j].parent == i) {
          out.first_child[row] = j;
          break;
        }
      }
      if (i > 0) {
        for (int j = i + 1; j < n; ++j) {
          if (nodes[j].parent == c.parent) {
            out.next_sibling[row] = j;
            break;
          }
        }
      }
    }
  }
  return out;
}

}  // namespace kdtree::ref
