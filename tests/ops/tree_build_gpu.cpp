// tree_build on the GPU against the CPU reference, exactly (scores bitwise):
// random batches across the shape grid (B 1..64, W 16..128, D 1..16, K 1..64,
// random budgets), drafts full of exact ties, -inf log-probs, optional scores.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/random_draft.hpp"
#include "reference/tree_build.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tree_ops.hpp"
#include "tests/support/device.hpp"
#include "tests/support/gpu_fixture.hpp"

using kdtree::test::DeviceBuffer;
using kdtree::test::Gpu;

namespace {

const char* const kTempDir = "kdtree-tree-build-gpu";

// Compares element-wise; reports the first mismatch as request / row.
template <typename T>
void check_same(const char* what, const std::vector<T>& got, const std::vector<T>& expect, int row_elems,
                int rows_per_request) {
  REQUIRE(got.size() == expect.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &expect[i], sizeof(T)) != 0) {
      const size_t row = i / row_elems;
      FAIL_CHECK(what << " differs at request " << row / rows_per_request << " row " << row % rows_per_request
                      << " (element " << i << "): got " << got[i] << ", expected " << expect[i]);
      return;
    }
  }
}

// Runs one batch on the device and compares every output with the reference.
void run_case(kdtree::Engine& rt, const kdtree::ref::TreeBuildInput& in, bool with_scores, CUstream stream = nullptr) {
  const int B = in.batch_size, W = in.max_tree_nodes, MW = (W + 63) / 64;
  kdtree::ref::TreeBuildOutput expect = kdtree::ref::tree_build(in);

  DeviceBuffer draft_tokens(in.draft_tokens), draft_logprobs(in.draft_logprobs), root_tokens(in.root_tokens),
      prefix_lens(in.prefix_lens);
  const size_t rows = size_t(B) * W;
  DeviceBuffer tokens(rows * 4), parents(rows * 4), depths(rows * 4), positions(rows * 4), mask(rows * MW * 8),
      first_child(rows * 4), next_sibling(rows * 4), counts(size_t(B) * 4), scores(with_scores ? rows * 4 : 0);

  kdtree_tree_build_args a{};
  a.batch_size = B;
  a.depth = in.depth;
  a.top_k = in.top_k;
  a.budget = in.budget;
  a.max_tree_nodes = W;
  a.draft_tokens = draft_tokens.get<const int32_t>();
  a.draft_logprobs = draft_logprobs.get<const float>();
  a.root_tokens = root_tokens.get<const int32_t>();
  a.prefix_lens = prefix_lens.get<const int32_t>();
  a.tokens = tokens.get<int32_t>();
  a.parents = parents.get<int32_t>();
  a.depths = depths.get<int32_t>();
  a.positions = positions.get<int32_t>();
  a.tree_mask = mask.get<uint64_t>();
  a.first_child = first_child.get<int32_t>();
  a.next_sibling = next_sibling.get<int32_t>();
  a.node_counts = counts.get<int32_t>();
  a.scores = with_scores ? scores.get<float>() : nullptr;
  a.stream = stream;
  kdtree::tree_build(rt, a);

  check_same("node_counts", counts.download<int32_t>(), expect.node_counts, 1, 1);
  check_same("tokens", tokens.download<int32_t>(), expect.tokens, 1, W);
  check_same("parents", parents.download<int32_t>(), expect.parents, 1, W);
  check_same("depths", depths.download<int32_t>(), expect.depths, 1, W);
  check_same("positions", positions.download<int32_t>(), expect.positions, 1, W);
  check_same("tree_mask", mask.download<uint64_t>(), expect.tree_mask, MW, W);
  check_same("first_child", first_child.download<int32_t>(), expect.first_child, 1, W);
  check_same("next_sibling", next_sibling.download<int32_t>(), expect.next_sibling, 1, W);
  if (with_scores) check_same("scores", scores.download<float>(), expect.scores, 1, W);
}

}  // namespace

TEST_CASE("tree_build GPU: random batches across the grid match the reference exactly") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(0x7b1d);
  for (int W : {16, 32, 64, 128}) {
    for (int trial = 0; trial < 12; ++trial) {
      const int B = trial == 0 ? 64 : 1 + int(rng() % 64);
      const int D = trial == 1 ? 16 : 1 + int(rng() % 16);
      const int K = trial == 1 ? 64 : 1 + int(rng() % 64);
      const int budget = trial < 3 ? W - 1 : 1 + int(rng() % (W - 1));
      kdtree::ref::RandomDraftOptions options;
      options.quantum = trial % 4 == 3 ? 0.25f : (trial % 4 == 2 ? 1.0f : 0.0f);  // exact ties
      INFO("tree_build[W=" << W << ",D=" << D << ",K=" << K << ",B=" << B << "] budget " << budget << " quantum "
                           << options.quantum);
      kdtree::ref::TreeBuildInput in = kdtree::ref::random_draft(rng, B, D, K, budget, W, options);
      run_case(rt, in, trial % 2 == 0);
    }
  }
}

TEST_CASE("tree_build GPU: small candidate trees (budget above the candidate count) and chains") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(11);
  const int shapes[][2] = {{1, 1}, {1, 5}, {2, 2}, {3, 1}, {16, 1}, {2, 3}, {1, 64}};
  for (int W : {16, 128}) {
    for (const auto& s : shapes) {
      INFO("tree_build[W=" << W << ",D=" << s[0] << ",K=" << s[1] << ",B=5] budget " << W - 1);
      kdtree::ref::TreeBuildInput in = kdtree::ref::random_draft(rng, 5, s[0], s[1], W - 1, W);
      run_case(rt, in, true);
    }
  }
}

TEST_CASE("tree_build GPU: all-equal and -inf log-probs resolve ties like the reference") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(5);
  for (int W : {32, 128}) {
    for (int variant = 0; variant < 3; ++variant) {
      const int B = 9, D = 6, K = 5;
      kdtree::ref::TreeBuildInput in = kdtree::ref::random_draft(rng, B, D, K, W - 1, W);
      for (size_t i = 0; i < in.draft_logprobs.size(); ++i) {
        const int k = int(i % K);
        if (variant == 0) in.draft_logprobs[i] = -1.0f;                                              // all tie
        if (variant == 1 && k >= 2) in.draft_logprobs[i] = -std::numeric_limits<float>::infinity();  // masked tail
        if (variant == 2) in.draft_logprobs[i] = k == 0 ? 0.0f : -0.5f;  // zero log-probs: ties across depths
      }
      INFO("tree_build[W=" << W << ",D=6,K=5,B=9] variant " << variant);
      run_case(rt, in, true);
    }
  }
}

TEST_CASE("tree_build GPU: runs on a non-default stream") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  const auto& api = kdtree::driver::api();
  CUstream stream = nullptr;
  kdtree::driver::check(api.cuStreamCreate(&stream, 0), "cuStreamCreate");
  std::mt19937_64 rng(3);
  kdtree::ref::TreeBuildInput in = kdtree::ref::random_draft(rng, 17, 8, 8, 63, 64);
  INFO("tree_build[W=64,D=8,K=8,B=17] stream");
  run_case(rt, in, true, stream);
  api.cuStreamDestroy(stream);
}
