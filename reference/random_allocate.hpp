// Random tree_allocate inputs for its tests: each request's scores a root of 0
// then non-increasing steps of multiples of 1/4 (coarse, so keys tie within and
// across requests), junk past cap when asked (never read), a random total, and
// optionally random active flags and remaining counts (some below 1).
#pragma once
#include <cmath>
#include <random>

#include "reference/tree_allocate.hpp"

namespace kdtree::ref {

inline TreeAllocateInput random_allocate_input(std::mt19937_64& rng, int B, int W, int cap, bool active, bool remaining,
                                               bool junk_past_cap = false) {
  TreeAllocateInput in;
  in.batch_size = B;
  in.max_tree_nodes = W;
  in.cap = cap;
  in.total = int(rng() % (B * cap + 1));
  std::uniform_real_distribution<float> step(0.0f, 1.5f);
  for (int b = 0; b < B; ++b) {
    float s = 0.0f;
    for (int j = 0; j < W; ++j) {
      if (j > 0 && rng() % 4) s -= std::round(step(rng) * 4) / 4;
      in.scores.push_back(junk_past_cap && j > cap && rng() % 2 ? float(rng() % 7) : s);
    }
    if (active) in.active.push_back(rng() % 5 ? 1 : 0);
    if (remaining) in.remaining.push_back(int(rng() % 300) - 2);
  }
  in.urgency = remaining ? 8.0f : 0.0f;
  return in;
}

}  // namespace kdtree::ref
