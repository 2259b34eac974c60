// The tree_build (DDTree) reference against hand-worked trees, an independent
// brute force (sort every candidate, take the best `budget`), and invariants on
// random drafts. CPU only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/random_draft.hpp"
#include "reference/tree_build.hpp"

using kdtree::ref::TreeBuildInput;
using kdtree::ref::TreeBuildOutput;

namespace {

// One request, D x K drafts given per depth (tokens and log-probs row-major).
TreeBuildInput one_request(int D, int K, int budget, int W, std::vector<int32_t> tokens, std::vector<float> logprobs,
                           int root = 7, int prefix = 100) {
  TreeBuildInput in;
  in.batch_size = 1;
  in.depth = D;
  in.top_k = K;
  in.budget = budget;
  in.max_tree_nodes = W;
  in.draft_tokens = std::move(tokens);
  in.draft_logprobs = std::move(logprobs);
  in.root_tokens = {root};
  in.prefix_lens = {prefix};
  return in;
}

template <typename T>
std::vector<T> head(const std::vector<T>& v, size_t n) {
  return std::vector<T>(v.begin(), v.begin() + std::min(n, v.size()));
}

// The rank path of every output node of request b, root = {}.
std::vector<std::vector<int>> rank_paths(const TreeBuildInput& in, const TreeBuildOutput& out, int b) {
  const int W = in.max_tree_nodes, K = in.top_k;
  const int n = out.node_counts[b];
  std::vector<std::vector<int>> paths(n);
  for (int i = 1; i < n; ++i) {
    const size_t row = size_t(b) * W + i;
    paths[i] = paths[out.parents[row]];
    const int d = out.depths[row];
    // Tokens are distinct within a depth in these tests, so the token names the rank.
    int rank = -1;
    for (int k = 0; k < K; ++k) {
      if (in.draft_tokens[(size_t(b) * in.depth + d - 1) * K + k] == out.tokens[row]) rank = k;
    }
    paths[i].push_back(rank);
  }
  return paths;
}

// Every candidate of request b (all rank paths of depth 1..D), sorted in pop order.
std::vector<std::vector<int>> brute_force_order(const TreeBuildInput& in, int b) {
  struct C {
    std::vector<int> path;
    float score;
  };
  const int D = in.depth, K = in.top_k;
  std::vector<C> all;
  std::vector<C> level{C{{}, 0.0f}};
  for (int d = 1; d <= D; ++d) {
    std::vector<C> next;
    for (const C& p : level) {
      for (int k = 0; k < K; ++k) {
        C c{p.path, p.score + in.draft_logprobs[(size_t(b) * D + d - 1) * K + k]};
        c.path.push_back(k);
        next.push_back(c);
      }
    }
    all.insert(all.end(), next.begin(), next.end());
    level = std::move(next);
  }
  std::sort(all.begin(), all.end(), [](const C& a, const C& c) {
    const uint32_t ka = kdtree::ref::score_order_key(a.score), kc = kdtree::ref::score_order_key(c.score);
    if (ka != kc) return ka > kc;
    if (a.path.size() != c.path.size()) return a.path.size() < c.path.size();
    return a.path < c.path;
  });
  std::vector<std::vector<int>> order;
  for (const C& c : all) order.push_back(c.path);
  return order;
}

// Structural invariants of request b's output.
void check_invariants(const TreeBuildInput& in, const TreeBuildOutput& out, int b) {
  const int W = in.max_tree_nodes, MW = out.mask_words;
  const int n = out.node_counts[b];
  const size_t base = size_t(b) * W;
  REQUIRE(n >= 2);
  REQUIRE(n <= in.budget + 1);
  CHECK(out.parents[base] == -1);
  CHECK(out.depths[base] == 0);
  CHECK(out.tokens[base] == in.root_tokens[b]);
  CHECK(out.positions[base] == in.prefix_lens[b]);
  CHECK(out.scores[base] == 0.0f);
  for (int i = 0; i < W; ++i) {
    const size_t row = base + i;
    if (i >= n) {
      CHECK(out.tokens[row] == -1);
      CHECK(out.parents[row] == -1);
      CHECK(out.first_child[row] == -1);
      CHECK(out.next_sibling[row] == -1);
      for (int w = 0; w < MW; ++w) CHECK(out.tree_mask[row * MW + w] == 0);
      CHECK(std::isinf(out.scores[row]));
      continue;
    }
    // Mask: self bit, parent's mask, nothing at or past n except self.
    for (int j = 0; j < W; ++j) {
      bool bit = (out.tree_mask[row * MW + j / 64] >> (j % 64)) & 1;
      bool expect = j == i;
      if (i > 0 && j != i) {
        const size_t prow = base + out.parents[row];
        expect = (out.tree_mask[prow * MW + j / 64] >> (j % 64)) & 1;
      }
      CHECK(bit == expect);
    }
    if (i > 0) {
      const int p = out.parents[row];
      CHECK(p >= 0);
      CHECK(p < i);
      CHECK(out.depths[row] == out.depths[base + p] + 1);
      CHECK(out.positions[row] == in.prefix_lens[b] + out.depths[row]);
      CHECK(out.scores[row] <= out.scores[base + i - 1]);  // log-probs <= 0: non-increasing
    }
    // Links.
    int fc = -1, ns = -1;
    for (int j = n - 1; j > i; --j) {
      if (out.parents[base + j] == i) fc = j;
      if (i > 0 && out.parents[base + j] == out.parents[row]) ns = j;
    }
    CHECK(out.first_child[row] == fc);
    CHECK(out.next_sibling[row] == ns);
  }
}

}  // namespace

TEST_CASE("tree_build reference: D=2 K=2 worked by hand") {
  // depth 1: tokens 10, 11 at -0.5, -1.0; depth 2: tokens 20, 21 at -0.25, -2.0.
  // Candidates: (0) -0.5, (1) -1.0, (0,0) -0.75, (0,1) -2.5, (1,0) -1.25, (1,1) -3.0.
  TreeBuildInput in = one_request(2, 2, 15, 16, {10, 11, 20, 21}, {-0.5f, -1.0f, -0.25f, -2.0f});
  TreeBuildOutput out = kdtree::ref::tree_build(in);
  INFO("tree_build[W=16,D=2,K=2,B=1]");
  REQUIRE(out.node_counts[0] == 7);  // budget > candidates: every candidate
  // Pop order: (0), (0,0), (1), (1,0), (0,1), (1,1).
  CHECK(head(out.tokens, 8) == std::vector<int32_t>{7, 10, 20, 11, 20, 21, 21, -1});
  CHECK(head(out.parents, 8) == std::vector<int32_t>{-1, 0, 1, 0, 3, 1, 3, -1});
  CHECK(head(out.depths, 8) == std::vector<int32_t>{0, 1, 2, 1, 2, 2, 2, -1});
  CHECK(head(out.positions, 8) == std::vector<int32_t>{100, 101, 102, 101, 102, 102, 102, -1});
  CHECK(head(out.tree_mask, 8) == std::vector<uint64_t>{1, 3, 7, 9, 25, 35, 73, 0});
  CHECK(head(out.first_child, 8) == std::vector<int32_t>{1, 2, -1, 4, -1, -1, -1, -1});
  CHECK(head(out.next_sibling, 8) == std::vector<int32_t>{-1, 3, 5, -1, 6, -1, -1, -1});
  CHECK(head(out.scores, 7) == std::vector<float>{0.0f, -0.5f, -0.75f, -1.0f, -1.25f, -2.5f, -3.0f});
  CHECK(std::isinf(out.scores[7]));
  check_invariants(in, out, 0);

  SUBCASE("budget 3 stops after three pops") {
    in.budget = 3;
    out = kdtree::ref::tree_build(in);
    CHECK(out.node_counts[0] == 4);
    CHECK(head(out.tokens, 5) == std::vector<int32_t>{7, 10, 20, 11, -1});
    CHECK(head(out.parents, 5) == std::vector<int32_t>{-1, 0, 1, 0, -1});
    CHECK(head(out.first_child, 5) == std::vector<int32_t>{1, 2, -1, -1, -1});
    CHECK(head(out.next_sibling, 5) == std::vector<int32_t>{-1, 3, -1, -1, -1});
  }
  SUBCASE("budget 1: the root's best child only") {
    in.budget = 1;
    out = kdtree::ref::tree_build(in);
    CHECK(out.node_counts[0] == 2);
    CHECK(head(out.tokens, 3) == std::vector<int32_t>{7, 10, -1});
    CHECK(head(out.tree_mask, 3) == std::vector<uint64_t>{1, 3, 0});
  }
}

TEST_CASE("tree_build reference: ties by depth - then by rank path") {
  INFO("tree_build[W=16,D=2,K=2,B=1]");
  SUBCASE("all log-probs equal: smaller depth, then lexicographic") {
    // (0) -1, (1) -1, then four depth-2 nodes at -2 in path order.
    TreeBuildInput in = one_request(2, 2, 15, 16, {10, 11, 20, 21}, {-1, -1, -1, -1});
    TreeBuildOutput out = kdtree::ref::tree_build(in);
    REQUIRE(out.node_counts[0] == 7);
    // (0), (1), (0,0), (0,1), (1,0), (1,1)
    CHECK(head(out.tokens, 7) == std::vector<int32_t>{7, 10, 11, 20, 21, 20, 21});
    CHECK(head(out.parents, 7) == std::vector<int32_t>{-1, 0, 0, 1, 1, 2, 2});
    check_invariants(in, out, 0);
  }
  SUBCASE("equal score, different depth: the shallower first") {
    // (1) = -1 at depth 1 ties (0,0) = 0 + -1 at depth 2.
    TreeBuildInput in = one_request(2, 2, 15, 16, {10, 11, 20, 21}, {0.0f, -1.0f, -1.0f, -3.0f});
    TreeBuildOutput out = kdtree::ref::tree_build(in);
    // (0) 0, (1) -1, (0,0) -1, (1,0) -2, (0,1) -3, (1,1) -4
    CHECK(head(out.tokens, 7) == std::vector<int32_t>{7, 10, 11, 20, 20, 21, 21});
    CHECK(head(out.parents, 7) == std::vector<int32_t>{-1, 0, 0, 1, 2, 1, 2});
    CHECK(head(out.scores, 7) == std::vector<float>{0, 0, -1, -1, -2, -3, -4});
  }
  SUBCASE("path order differs from the parents' pop order") {
    // (1,0) = -1.75 pops before (0,1) = -3, yet their children (0,1,0) and
    // (1,0,1) tie at -3.5 and (0,1,0) comes first: it is lexicographically smaller.
    TreeBuildInput in =
        one_request(3, 2, 15, 16, {10, 11, 20, 21, 30, 31}, {-1.0f, -1.5f, -0.25f, -2.0f, -0.5f, -1.75f});
    TreeBuildOutput out = kdtree::ref::tree_build(in);
    std::vector<std::vector<int>> paths = rank_paths(in, out, 0);
    auto at = [&](std::vector<int> p) { return std::find(paths.begin(), paths.end(), p) - paths.begin(); };
    REQUIRE(at({1, 0}) < at({0, 1}));
    REQUIRE(at({0, 1, 0}) < int(paths.size()));
    REQUIRE(at({1, 0, 1}) < int(paths.size()));
    CHECK(at({0, 1, 0}) + 1 == at({1, 0, 1}));
    check_invariants(in, out, 0);
  }
}

TEST_CASE("tree_build reference: K=1 and D=1 edge shapes") {
  SUBCASE("K=1 is a chain") {
    INFO("tree_build[W=16,D=4,K=1,B=1]");
    TreeBuildInput in = one_request(4, 1, 10, 16, {1, 2, 3, 4}, {-0.1f, -0.2f, -0.3f, -0.4f});
    TreeBuildOutput out = kdtree::ref::tree_build(in);
    CHECK(out.node_counts[0] == 5);
    CHECK(head(out.parents, 6) == std::vector<int32_t>{-1, 0, 1, 2, 3, -1});
    CHECK(head(out.tree_mask, 6) == std::vector<uint64_t>{1, 3, 7, 15, 31, 0});
    CHECK(head(out.next_sibling, 5) == std::vector<int32_t>{-1, -1, -1, -1, -1});
  }
  SUBCASE("D=1 is a star") {
    INFO("tree_build[W=16,D=1,K=4,B=1]");
    TreeBuildInput in = one_request(1, 4, 3, 16, {1, 2, 3, 4}, {-0.1f, -0.2f, -0.3f, -0.4f});
    TreeBuildOutput out = kdtree::ref::tree_build(in);
    CHECK(out.node_counts[0] == 4);
    CHECK(head(out.tokens, 5) == std::vector<int32_t>{7, 1, 2, 3, -1});
    CHECK(head(out.next_sibling, 5) == std::vector<int32_t>{-1, 2, 3, -1, -1});
    CHECK(head(out.first_child, 5) == std::vector<int32_t>{1, -1, -1, -1, -1});
  }
}

TEST_CASE("tree_build reference: pop order equals the sorted candidates (brute force)") {
  std::mt19937_64 rng(20240601);
  for (int trial = 0; trial < 60; ++trial) {
    const int D = 1 + int(rng() % 4), K = 1 + int(rng() % 4);
    const int W = 16 << (rng() % 4);
    const int budget = 1 + int(rng() % (W - 1));
    kdtree::ref::RandomDraftOptions options;
    options.quantum = trial % 2 ? 0.25f : 0.0f;  // every other trial is full of exact ties
    TreeBuildInput in = kdtree::ref::random_draft(rng, 2, D, K, budget, W, options);
    TreeBuildOutput out = kdtree::ref::tree_build(in);
    for (int b = 0; b < in.batch_size; ++b) {
      INFO("tree_build[W=" << W << ",D=" << D << ",K=" << K << ",B=2] budget " << budget << " request " << b
                           << " quantum " << options.quantum);
      std::vector<std::vector<int>> expect = brute_force_order(in, b);
      expect.resize(std::min<size_t>(expect.size(), budget));
      std::vector<std::vector<int>> got = rank_paths(in, out, b);
      got.erase(got.begin());  // the root
      CHECK(got == expect);
      check_invariants(in, out, b);
    }
  }
}

TEST_CASE("tree_build reference: invariants on random drafts across the grid") {
  std::mt19937_64 rng(7);
  for (int W : {16, 32, 64, 128}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int D = 1 + int(rng() % 16), K = 1 + int(rng() % 64), B = 1 + int(rng() % 5);
      const int budget = 1 + int(rng() % (W - 1));
      kdtree::ref::RandomDraftOptions options;
      options.quantum = trial % 3 == 0 ? 0.5f : 0.0f;
      TreeBuildInput in = kdtree::ref::random_draft(rng, B, D, K, budget, W, options);
      TreeBuildOutput out = kdtree::ref::tree_build(in);
      for (int b = 0; b < B; ++b) {
        INFO("tree_build[W=" << W << ",D=" << D << ",K=" << K << ",B=" << B << "] budget " << budget << " request "
                             << b);
        long long candidates = 0, level = 1;
        for (int d = 0; d < D && candidates < budget; ++d) candidates += (level *= K);
        CHECK(out.node_counts[b] == 1 + std::min<long long>(budget, candidates));
        check_invariants(in, out, b);
      }
    }
  }
}

TEST_CASE("tree_build reference: rejects malformed inputs") {
  TreeBuildInput in = one_request(2, 2, 3, 16, {10, 11, 20, 21}, {-0.5f, -1.0f, -0.25f, -2.0f});
  in.budget = 16;
  CHECK_THROWS_AS(kdtree::ref::tree_build(in), std::invalid_argument);
  in.budget = 3;
  in.max_tree_nodes = 48;
  CHECK_THROWS_AS(kdtree::ref::tree_build(in), std::invalid_argument);
  in.max_tree_nodes = 16;
  in.draft_logprobs.pop_back();
  CHECK_THROWS_AS(kdtree::ref::tree_build(in), std::invalid_argument);
}
