// The tree_accept reference against hand-worked trees: full acceptance, none
// accepted, duplicate-token siblings, packed targets, malformed requests; and
// its agreement with a tree_build tree on random targets. CPU only.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/random_draft.hpp"
#include "reference/tree_accept.hpp"
#include "reference/tree_build.hpp"

using kdtree::ref::TreeAcceptInput;
using kdtree::ref::TreeAcceptOutput;

namespace {

constexpr int kW = 16;

// One request of the padded layout: n nodes, the rest -1.
TreeAcceptInput one_tree(std::vector<int32_t> tokens, std::vector<int32_t> parents, std::vector<int32_t> targets) {
  TreeAcceptInput in;
  in.batch_size = 1;
  in.max_tree_nodes = kW;
  in.node_counts = {int32_t(tokens.size())};
  tokens.resize(kW, -1);
  parents.resize(kW, -1);
  targets.resize(kW, -1);
  in.tokens = tokens;
  in.parents = parents;
  in.target_tokens = targets;
  return in;
}

std::vector<int32_t> path_head(const TreeAcceptOutput& out, int n) {
  return std::vector<int32_t>(out.accepted_path.begin(), out.accepted_path.begin() + n);
}

// tree_build's worked D=2, K=2 tree: (0)=10, (0,0)=20, (1)=11, (1,0)=20, (0,1)=21, (1,1)=21.
const std::vector<int32_t> kTokens{7, 10, 20, 11, 20, 21, 21};
const std::vector<int32_t> kParents{-1, 0, 1, 0, 3, 1, 3};

}  // namespace

TEST_CASE("tree_accept reference: worked by hand") {
  INFO("tree_accept[W=16,B=1]");
  SUBCASE("full acceptance to a leaf") {
    // root -> 10 (node 1) -> 21 (node 5); bonus = target at node 5.
    TreeAcceptOutput out = kdtree::ref::tree_accept(one_tree(kTokens, kParents, {10, 21, 0, 0, 0, 99, 0}));
    CHECK(path_head(out, 4) == std::vector<int32_t>{0, 1, 5, -1});
    CHECK(out.accept_lens[0] == 2);
    CHECK(out.bonus_tokens[0] == 99);
    CHECK(out.error_flags == 0);
  }
  SUBCASE("the other branch") {
    TreeAcceptOutput out = kdtree::ref::tree_accept(one_tree(kTokens, kParents, {11, 0, 0, 20, 42, 0, 0}));
    CHECK(path_head(out, 4) == std::vector<int32_t>{0, 3, 4, -1});
    CHECK(out.accept_lens[0] == 2);
    CHECK(out.bonus_tokens[0] == 42);
  }
  SUBCASE("none accepted") {
    TreeAcceptOutput out = kdtree::ref::tree_accept(one_tree(kTokens, kParents, {55, 21, 20, 20, 0, 0, 0}));
    CHECK(path_head(out, 2) == std::vector<int32_t>{0, -1});
    CHECK(out.accept_lens[0] == 0);
    CHECK(out.bonus_tokens[0] == 55);
  }
  SUBCASE("stops in the middle") {
    TreeAcceptOutput out = kdtree::ref::tree_accept(one_tree(kTokens, kParents, {10, 33, 20, 20, 0, 0, 0}));
    CHECK(path_head(out, 3) == std::vector<int32_t>{0, 1, -1});
    CHECK(out.accept_lens[0] == 1);
    CHECK(out.bonus_tokens[0] == 33);
  }
  SUBCASE("duplicate-token siblings: the lowest index wins, even when a later one goes deeper") {
    // nodes 1 and 2 both carry 5 under the root; only node 2 has a matching child.
    TreeAcceptOutput out = kdtree::ref::tree_accept(one_tree({0, 5, 5, 6, 8}, {-1, 0, 0, 2, 1}, {5, 8, 6, 0, 3}));
    CHECK(path_head(out, 4) == std::vector<int32_t>{0, 1, 4, -1});
    CHECK(out.accept_lens[0] == 2);
    CHECK(out.bonus_tokens[0] == 3);
  }
  SUBCASE("a single-node tree accepts nothing and returns the root's target") {
    TreeAcceptOutput out = kdtree::ref::tree_accept(one_tree({4}, {-1}, {77}));
    CHECK(out.accept_lens[0] == 0);
    CHECK(out.bonus_tokens[0] == 77);
    CHECK(path_head(out, 2) == std::vector<int32_t>{0, -1});
  }
}

TEST_CASE("tree_accept reference: packed targets") {
  INFO("tree_accept[W=16,B=2] packed");
  TreeAcceptInput a = one_tree(kTokens, kParents, {});
  TreeAcceptInput in;
  in.batch_size = 2;
  in.max_tree_nodes = kW;
  in.tokens = a.tokens;
  in.tokens.insert(in.tokens.end(), a.tokens.begin(), a.tokens.end());
  in.parents = a.parents;
  in.parents.insert(in.parents.end(), a.parents.begin(), a.parents.end());
  in.node_counts = {7, 4};
  in.node_indptr = {0, 7, 11};
  in.target_tokens = {10, 21, 0, 0, 0, 99, 0, /* request 1 */ 11, 0, 0, 64};
  TreeAcceptOutput out = kdtree::ref::tree_accept(in);
  CHECK(out.accept_lens == std::vector<int32_t>{2, 1});
  CHECK(out.bonus_tokens == std::vector<int32_t>{99, 64});
  CHECK(out.accepted_path[kW + 0] == 0);
  CHECK(out.accepted_path[kW + 1] == 3);
  CHECK(out.accepted_path[kW + 2] == -1);
}

TEST_CASE("tree_accept reference: malformed requests get error bits and -1 outputs") {
  INFO("tree_accept[W=16,B=1] malformed");
  struct Bad {
    const char* what;
    std::vector<int32_t> parents;
    int count;
    int error;
  };
  std::vector<Bad> cases{
      {"root parent not -1", {0, 0, 1}, 3, KDTREE_DEVICE_ERROR_TREE},
      {"parent after child", {-1, 2, 0}, 3, KDTREE_DEVICE_ERROR_TREE},
      {"self parent", {-1, 1, 0}, 3, KDTREE_DEVICE_ERROR_TREE},
      {"negative parent", {-1, 0, -1}, 3, KDTREE_DEVICE_ERROR_TREE},
      {"zero nodes", {-1, 0, 1}, 0, KDTREE_DEVICE_ERROR_NODE_COUNT},
      {"more nodes than W", {-1, 0, 1}, kW + 1, KDTREE_DEVICE_ERROR_NODE_COUNT},
  };
  for (const Bad& c : cases) {
    INFO(c.what);
    TreeAcceptInput in = one_tree({1, 2, 3}, c.parents, {2, 3, 4});
    in.node_counts = {c.count};
    TreeAcceptOutput out = kdtree::ref::tree_accept(in);
    CHECK(out.error_flags == c.error);
    CHECK(out.accept_lens[0] == -1);
    CHECK(out.bonus_tokens[0] == -1);
    CHECK(out.accepted_path == std::vector<int32_t>(kW, -1));
  }
  SUBCASE("node_indptr segment disagrees with the node count") {
    TreeAcceptInput in = one_tree({1, 2, 3}, {-1, 0, 1}, {});
    in.node_indptr = {0, 2};
    in.target_tokens = {2, 3};
    TreeAcceptOutput out = kdtree::ref::tree_accept(in);
    CHECK(out.error_flags == KDTREE_DEVICE_ERROR_NODE_COUNT);
    CHECK(out.accept_lens[0] == -1);
  }
  SUBCASE("node_indptr segment past total_nodes (the packed targets' length)") {
    TreeAcceptInput in = one_tree({1, 2, 3}, {-1, 0, 1}, {});
    in.node_indptr = {1, 4};
    in.target_tokens = {2, 3, 4};  // total_nodes 3: the segment [1, 4) leaves it
    TreeAcceptOutput out = kdtree::ref::tree_accept(in);
    CHECK(out.error_flags == KDTREE_DEVICE_ERROR_NODE_COUNT);
    CHECK(out.accept_lens[0] == -1);
    CHECK(out.bonus_tokens[0] == -1);
  }
}

TEST_CASE("tree_accept reference: paths on tree_build trees follow the targets") {
  std::mt19937_64 rng(99);
  for (int W : {16, 32, 64, 128}) {
    kdtree::ref::TreeBuildInput draft = kdtree::ref::random_draft(rng, 8, 8, 8, W - 1, W);
    kdtree::ref::TreeBuildOutput tree = kdtree::ref::tree_build(draft);
    TreeAcceptInput in;
    in.batch_size = 8;
    in.max_tree_nodes = W;
    in.tokens = tree.tokens;
    in.parents = tree.parents;
    in.node_counts = tree.node_counts;
    in.target_tokens = kdtree::ref::random_accept_targets(rng, 8, W, tree.tokens, tree.parents, tree.node_counts);
    TreeAcceptOutput out = kdtree::ref::tree_accept(in);
    CHECK(out.error_flags == 0);
    for (int b = 0; b < 8; ++b) {
      INFO("tree_accept[W=" << W << ",B=8] request " << b);
      const size_t base = size_t(b) * W;
      const int len = out.accept_lens[b];
      REQUIRE(len >= 0);
      CHECK(out.accepted_path[base] == 0);
      for (int j = 1; j <= len; ++j) {
        const int node = out.accepted_path[base + j], prev = out.accepted_path[base + j - 1];
        CHECK(tree.parents[base + node] == prev);
        CHECK(tree.tokens[base + node] == in.target_tokens[base + prev]);
        CHECK(tree.depths[base + node] == j);
      }
      const int last = out.accepted_path[base + len];
      CHECK(out.bonus_tokens[b] == in.target_tokens[base + last]);
      // No child of the last node matches its target.
      for (int i = 1; i < tree.node_counts[b]; ++i) {
        if (tree.parents[base + i] == last) CHECK(tree.tokens[base + i] != in.target_tokens[base + last]);
      }
      for (int j = len + 1; j < W; ++j) CHECK(out.accepted_path[base + j] == -1);
    }
  }
}
