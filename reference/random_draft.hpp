// Random drafter outputs for tree_build / tree_accept tests and benchmarks:
// per-depth top-K tokens with log-probs that look like a drafter's (a random
// sharpness per depth, sorted descending, some mass left off the top K), and
// target tokens that follow a random path of a tree part of the way.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "reference/tree_build.hpp"

namespace kdtree::ref {

struct RandomDraftOptions {
  int vocab = 32000;
  // > 0: log-probs are rounded to multiples of this power of two, so many paths
  // tie exactly (sums stay exact in float32) and the tie order is exercised.
  float quantum = 0.0f;
};

// A tree_build input with random drafts, roots and prefix lengths.
inline TreeBuildInput random_draft(std::mt19937_64& rng, int batch_size, int depth, int top_k, int budget,
                                   int max_tree_nodes, const RandomDraftOptions& options = {}) {
  TreeBuildInput in;
  in.batch_size = batch_size;
  in.depth = depth;
  in.top_k = top_k;
  in.budget = budget;
  in.max_tree_nodes = max_tree_nodes;
  const size_t dk = size_t(depth) * top_k;
  in.draft_tokens.resize(batch_size * dk);
  in.draft_logprobs.resize(batch_size * dk);
  std::uniform_int_distribution<int> token(0, options.vocab - 1);
  std::uniform_real_distribution<float> sharpness(0.3f, 4.0f);
  std::uniform_real_distribution<float> rest_mass(0.0f, 3.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int b = 0; b < batch_size; ++b) {
    for (int d = 0; d < depth; ++d) {
      const size_t at = b * dk + size_t(d) * top_k;
      std::set<int> used;
      std::vector<float> logits(top_k);
      const float s = sharpness(rng);
      for (int k = 0; k < top_k; ++k) {
        int t;
        do t = token(rng);
        while (!used.insert(t).second && int(used.size()) < options.vocab);
        in.draft_tokens[at + k] = t;
        logits[k] = s * normal(rng);
      }
      std::sort(logits.begin(), logits.end(), [](float x, float y) { return x > y; });
      // log-softmax over the top K plus the mass of the tokens left off.
      double sum = std::exp(double(rest_mass(rng)) - logits[0]);
      for (float x : logits) sum += std::exp(double(x) - logits[0]);
      const double lse = logits[0] + std::log(sum);
      for (int k = 0; k < top_k; ++k) {
        float lp = float(double(logits[k]) - lse);
        if (options.quantum > 0.0f) lp = -options.quantum * std::round(-lp / options.quantum);
        in.draft_logprobs[at + k] = std::min(lp, 0.0f);
      }
    }
  }
  std::uniform_int_distribution<int> prefix(0, 4096);
  for (int b = 0; b < batch_size; ++b) {
    in.root_tokens.push_back(token(rng));
    in.prefix_lens.push_back(prefix(rng));
  }
  return in;
}

// Padded [B, W] target tokens for a tree in tree_build's layout: from the root,
// a random child is followed while a coin with probability `follow` says so;
// every other node's target is a token of one of its children or a random one,
// so lowest-index duplicate matches and dead ends both happen.
inline std::vector<int32_t> random_accept_targets(std::mt19937_64& rng, int batch_size, int max_tree_nodes,
                                                  const std::vector<int32_t>& tokens,
                                                  const std::vector<int32_t>& parents,
                                                  const std::vector<int32_t>& node_counts, double follow = 0.8,
                                                  int vocab = 32000) {
  const int W = max_tree_nodes;
  std::vector<int32_t> targets(size_t(batch_size) * W, -1);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int b = 0; b < batch_size; ++b) {
    const size_t base = size_t(b) * W;
    const int n = std::clamp(node_counts[b], 0, W);
    std::vector<std::vector<int>> children(n);
    for (int i = 1; i < n; ++i) {
      const int p = parents[base + i];
      if (p >= 0 && p < i) children[p].push_back(i);
    }
    for (int i = 0; i < n; ++i) {
      const bool any = !children[i].empty() && coin(rng) < 0.5;
      targets[base + i] = any ? tokens[base + children[i][rng() % children[i].size()]] : token(rng);
    }
    int cur = 0;
    while (cur < n && !children[cur].empty() && coin(rng) < follow) {
      const int next = children[cur][rng() % children[cur].size()];
      targets[base + cur] = tokens[base + next];
      cur = next;
    }
  }
  return targets;
}

}  // namespace kdtree::ref
