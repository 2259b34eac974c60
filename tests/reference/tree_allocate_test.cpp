// The tree_allocate reference against hand-worked batches (by score, ties,
// requests not decoding, the remaining-tokens weight, bad scores) and, on random
// batches, the properties that define the choice: total nodes, at most cap each,
// a prefix of every tree, and no unchosen node above a chosen one. CPU only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/random_allocate.hpp"
#include "reference/tree_allocate.hpp"

using kdtree::ref::TreeAllocateInput;
using kdtree::ref::TreeAllocateOutput;

namespace {

constexpr int kW = 16;

// Requests' draft-node scores (nodes 1..), padded to W with -inf; the root's score is 0.
TreeAllocateInput batch(const std::vector<std::vector<float>>& nodes, int cap, int total) {
  TreeAllocateInput in;
  in.batch_size = int(nodes.size());
  in.max_tree_nodes = kW;
  in.cap = cap;
  in.total = total;
  for (const auto& row : nodes) {
    in.scores.push_back(0.0f);
    for (int j = 1; j < kW; ++j) {
      in.scores.push_back(j - 1 < int(row.size()) ? row[j - 1] : -std::numeric_limits<float>::infinity());
    }
  }
  return in;
}

}  // namespace

TEST_CASE("tree_allocate reference: worked by hand") {
  INFO("tree_allocate[W=16]");
  SUBCASE("by score") {
    // -0.5 (request 1), -1 (request 0), -1.5 (request 1): counts 2 and 3.
    TreeAllocateOutput out = kdtree::ref::tree_allocate(batch({{-1, -2, -3}, {-0.5f, -1.5f, -4}}, 3, 3));
    CHECK(out.node_counts == std::vector<int32_t>{2, 3});
    CHECK(out.node_indptr == std::vector<int32_t>{0, 2, 5});
    CHECK(out.row_req == std::vector<int64_t>{0, 0, 1, 1, 1});
    CHECK(out.row_node == std::vector<int64_t>{0, 1, 0, 1, 2});
    CHECK(out.error_flags == 0);
  }
  SUBCASE("equal scores go to the lower request, then the lower node") {
    TreeAllocateOutput out = kdtree::ref::tree_allocate(batch({{-1, -2, -2}, {-1, -2, -3}}, 3, 3));
    CHECK(out.node_counts == std::vector<int32_t>{3, 2});
    out = kdtree::ref::tree_allocate(batch({{-1, -2, -2}, {-1, -2, -3}}, 3, 4));
    CHECK(out.node_counts == std::vector<int32_t>{4, 2});
  }
  SUBCASE("a request not decoding takes nodes after every decoding one has its cap") {
    TreeAllocateInput in = batch({{-0.1f, -0.2f, -0.3f}, {-5, -6, -7}}, 2, 3);
    in.active = {0, 1};
    TreeAllocateOutput out = kdtree::ref::tree_allocate(in);
    CHECK(out.node_counts == std::vector<int32_t>{2, 3});
  }
  SUBCASE("cap bounds each request") {
    TreeAllocateOutput out = kdtree::ref::tree_allocate(batch({{-1, -1.1f, -1.2f}, {-9, -10, -11}}, 2, 3));
    CHECK(out.node_counts == std::vector<int32_t>{3, 2});
  }
  SUBCASE("the remaining-tokens weight") {
    // Request 1 has half the batch's most tokens left: 8 ln(1/2) = -5.55 on its scores.
    TreeAllocateInput in = batch({{-3, -4, -5}, {-0.5f, -1, -2}}, 3, 3);
    in.remaining = {128, 64};
    in.urgency = 8.0f;
    TreeAllocateOutput out = kdtree::ref::tree_allocate(in);
    CHECK(out.node_counts == std::vector<int32_t>{4, 1});
    CHECK(out.keys[3] == doctest::Approx(-0.5 + 8.0 * std::log(0.5)).epsilon(1e-6));
    in.urgency = 0.0f;  // by score alone
    CHECK(kdtree::ref::tree_allocate(in).node_counts == std::vector<int32_t>{1, 4});
    in.remaining = {0, -3};  // below 1 counts as 1: equal weights
    in.urgency = 8.0f;
    CHECK(kdtree::ref::tree_allocate(in).node_counts == std::vector<int32_t>{1, 4});
  }
  SUBCASE("total 0 keeps the roots") {
    TreeAllocateOutput out = kdtree::ref::tree_allocate(batch({{-1}, {-2}}, 1, 0));
    CHECK(out.node_counts == std::vector<int32_t>{1, 1});
    CHECK(out.row_req == std::vector<int64_t>{0, 1});
  }
  SUBCASE("a NaN or increasing score: SCORES, roots only, rows past B (0, 0)") {
    for (float bad : {std::nanf(""), -0.5f}) {
      TreeAllocateOutput out = kdtree::ref::tree_allocate(batch({{-1, bad, -3}, {-0.5f, -1.5f, -4}}, 3, 3));
      CHECK(out.error_flags == KDTREE_DEVICE_ERROR_SCORES);
      CHECK(out.node_counts == std::vector<int32_t>{1, 1});
      CHECK(out.node_indptr == std::vector<int32_t>{0, 1, 2});
      CHECK(out.row_req == std::vector<int64_t>{0, 1, 0, 0, 0});
      CHECK(out.row_node == std::vector<int64_t>{0, 0, 0, 0, 0});
    }
    // Past cap nothing is read: an increase there is no error.
    TreeAllocateOutput out = kdtree::ref::tree_allocate(batch({{-1, -2, 5}, {-0.5f, -1.5f, 7}}, 2, 2));
    CHECK(out.error_flags == 0);
  }
}

TEST_CASE("tree_allocate reference: random batches keep the allocation's properties") {
  std::mt19937_64 rng(0xa110c);
  for (int trial = 0; trial < 200; ++trial) {
    const int B = 1 + int(rng() % 40), W = 16 << (rng() % 4), cap = 1 + int(rng() % (W - 1));
    TreeAllocateInput in = kdtree::ref::random_allocate_input(rng, B, W, cap, true, true);
    in.urgency = (trial % 3) * 4.0f;
    INFO("tree_allocate[W=" << W << ",B=" << B << "] cap " << cap << " total " << in.total);
    const TreeAllocateOutput out = kdtree::ref::tree_allocate(in);
    REQUIRE(out.error_flags == 0);
    const kdtree::ref::AllocationSpan span = kdtree::ref::allocation_span(out, cap, out.node_counts);
    CHECK(span.fewest >= 0);
    CHECK(span.most <= cap);
    CHECK(span.drafts == in.total);
    CHECK(out.node_indptr[B] == B + in.total);
    if (in.total > 0 && in.total < B * cap) CHECK(span.lowest_taken >= span.highest_left);
  }
}
