// tree_accept on the GPU against the CPU reference, exactly: tree_build trees
// and random trees with duplicate-token siblings, uneven node counts, targets
// that follow a random path part of the way (padded and packed), and malformed
// requests mixed into good batches (error bits, -1 outputs, neighbours intact),
// including node_indptr segments past total_nodes (never read: the target buffer
// is exactly total_nodes long, so compute-sanitizer memcheck would see a read past it).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/random_draft.hpp"
#include "reference/tree_accept.hpp"
#include "reference/tree_build.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tree_ops.hpp"
#include "tests/support/device.hpp"
#include "tests/support/gpu_fixture.hpp"

using kdtree::ref::TreeAcceptInput;
using kdtree::ref::TreeAcceptOutput;
using kdtree::test::DeviceBuffer;
using kdtree::test::Gpu;

namespace {

const char* const kTempDir = "kdtree-tree-accept-gpu";

void check_same(const char* what, const std::vector<int32_t>& got, const std::vector<int32_t>& expect,
                int per_request) {
  REQUIRE(got.size() == expect.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expect[i]) {
      FAIL_CHECK(what << " differs at request " << i / per_request << " entry " << i % per_request << ": got " << got[i]
                      << ", expected " << expect[i]);
      return;
    }
  }
}

// A random tree per request: node counts 1..W, parent of i uniform in [0, i),
// tokens from a tiny vocabulary (so siblings share tokens), junk past the count.
TreeAcceptInput random_trees(std::mt19937_64& rng, int B, int W, int vocab) {
  TreeAcceptInput in;
  in.batch_size = B;
  in.max_tree_nodes = W;
  in.tokens.resize(size_t(B) * W);
  in.parents.resize(size_t(B) * W);
  for (int b = 0; b < B; ++b) {
    const int n = b == 0 ? W : 1 + int(rng() % W);
    in.node_counts.push_back(n);
    for (int i = 0; i < W; ++i) {
      const size_t at = size_t(b) * W + i;
      in.tokens[at] = i < n ? int(rng() % vocab) : int(rng());
      // Bushy or deep: half the requests prefer recent parents (long chains).
      const int p = (b % 2) ? i - 1 - int(rng() % std::min(i == 0 ? 1 : i, 3)) : (i == 0 ? 0 : int(rng() % i));
      in.parents[at] = i == 0 ? -1 : (i < n ? p : int(rng()));
    }
  }
  return in;
}

// Packs padded [B, W] targets into [total_nodes] with node_indptr.
void pack_targets(TreeAcceptInput& in) {
  const int W = in.max_tree_nodes;
  std::vector<int32_t> packed;
  in.node_indptr = {0};
  for (int b = 0; b < in.batch_size; ++b) {
    const int n = std::max(0, std::min(in.node_counts[b], W));
    for (int i = 0; i < n; ++i) packed.push_back(in.target_tokens[size_t(b) * W + i]);
    in.node_indptr.push_back(int32_t(packed.size()));
  }
  in.target_tokens = packed;
}

// Runs the batch on the device and compares with the reference.
void run_case(kdtree::Engine& rt, const TreeAcceptInput& in, bool with_flags = true) {
  const int B = in.batch_size, W = in.max_tree_nodes;
  TreeAcceptOutput expect = kdtree::ref::tree_accept(in);
  DeviceBuffer tokens(in.tokens), parents(in.parents), counts(in.node_counts);
  std::vector<int32_t> targets_host = in.target_tokens;
  if (targets_host.empty()) targets_host.push_back(0);  // every request malformed and packed
  DeviceBuffer targets(targets_host);
  DeviceBuffer indptr = in.node_indptr.empty() ? DeviceBuffer() : DeviceBuffer(in.node_indptr);
  DeviceBuffer path(size_t(B) * W * 4), lens(size_t(B) * 4), bonus(size_t(B) * 4);
  DeviceBuffer flags(std::vector<int32_t>{0});

  kdtree_tree_accept_args a{};
  a.batch_size = B;
  a.max_tree_nodes = W;
  a.tokens = tokens.get<const int32_t>();
  a.parents = parents.get<const int32_t>();
  a.node_counts = counts.get<const int32_t>();
  a.target_tokens = targets.get<const int32_t>();
  a.node_indptr = in.node_indptr.empty() ? nullptr : indptr.get<const int32_t>();
  a.total_nodes = in.node_indptr.empty() ? 0 : int(in.target_tokens.size());  // the packed targets' length
  a.accepted_path = path.get<int32_t>();
  a.accept_lens = lens.get<int32_t>();
  a.bonus_tokens = bonus.get<int32_t>();
  a.error_flags = with_flags ? flags.get<int32_t>() : nullptr;
  kdtree::tree_accept(rt, a);

  check_same("accept_lens", lens.download<int32_t>(), expect.accept_lens, 1);
  check_same("bonus_tokens", bonus.download<int32_t>(), expect.bonus_tokens, 1);
  check_same("accepted_path", path.download<int32_t>(), expect.accepted_path, W);
  if (with_flags) CHECK(flags.download<int32_t>()[0] == expect.error_flags);
}

}  // namespace

TEST_CASE("tree_accept GPU: tree_build trees with targets that follow a path partly") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(0xacce);
  for (int W : {16, 32, 64, 128}) {
    for (int trial = 0; trial < 6; ++trial) {
      const int B = trial == 0 ? 64 : 1 + int(rng() % 64);
      const int D = 1 + int(rng() % 16), K = 1 + int(rng() % 8);
      const int budget = 1 + int(rng() % (W - 1));
      kdtree::ref::TreeBuildOutput tree = kdtree::ref::tree_build(kdtree::ref::random_draft(rng, B, D, K, budget, W));
      TreeAcceptInput in;
      in.batch_size = B;
      in.max_tree_nodes = W;
      in.tokens = tree.tokens;
      in.parents = tree.parents;
      in.node_counts = tree.node_counts;
      const double follow = trial % 3 == 0 ? 1.0 : 0.8;
      in.target_tokens =
          kdtree::ref::random_accept_targets(rng, B, W, tree.tokens, tree.parents, tree.node_counts, follow);
      const bool packed = trial % 2 == 1;
      if (packed) pack_targets(in);
      INFO("tree_accept[W=" << W << ",B=" << B << "] D " << D << " K " << K << " budget " << budget
                            << (packed ? " packed" : " padded"));
      run_case(rt, in);
    }
  }
}

TEST_CASE("tree_accept GPU: random trees with duplicate-token siblings - padded and packed") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(77);
  for (int W : {16, 32, 64, 128}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int B = 1 + int(rng() % 64);
      const int vocab = 2 + trial % 3;
      TreeAcceptInput in = random_trees(rng, B, W, vocab);
      in.target_tokens =
          kdtree::ref::random_accept_targets(rng, B, W, in.tokens, in.parents, in.node_counts, 0.9, vocab);
      const bool packed = trial % 2 == 1;
      if (packed) pack_targets(in);
      INFO("tree_accept[W=" << W << ",B=" << B << "] vocab " << vocab << (packed ? " packed" : " padded"));
      run_case(rt, in);
    }
  }
}

TEST_CASE("tree_accept GPU: malformed requests set error bits and -1 outputs - neighbours unaffected") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(404);
  for (int W : {16, 128}) {
    for (bool packed : {false, true}) {
      const int B = 12;
      TreeAcceptInput in = random_trees(rng, B, W, 3);
      for (int b = 0; b < B; ++b) in.node_counts[b] = std::max(in.node_counts[b], 3);
      in.target_tokens = kdtree::ref::random_accept_targets(rng, B, W, in.tokens, in.parents, in.node_counts, 0.9, 3);
      auto parent = [&](int b, int i) -> int32_t& { return in.parents[size_t(b) * W + i]; };
      parent(1, 0) = 0;            // root parent not -1
      parent(3, 2) = 2;            // self parent
      parent(5, 1) = 7 % W;        // parent after the child
      parent(7, 2) = -5;           // negative parent
      in.node_counts[9] = 0;       // no nodes
      in.node_counts[11] = W + 1;  // more than W
      if (packed) {
        pack_targets(in);
        // Request 10's count disagrees with its node_indptr segment.
        in.node_counts[10] += in.node_counts[10] < W ? 1 : -1;
      }
      INFO("tree_accept[W=" << W << ",B=12] malformed" << (packed ? " packed" : " padded"));
      TreeAcceptOutput expect = kdtree::ref::tree_accept(in);
      CHECK(expect.error_flags == (KDTREE_DEVICE_ERROR_TREE | KDTREE_DEVICE_ERROR_NODE_COUNT));
      CHECK(expect.accept_lens[0] >= 0);
      run_case(rt, in, true);
      run_case(rt, in, false);  // no error word: outputs still -1, nothing else breaks
    }
  }
}

TEST_CASE("tree_accept GPU: node_indptr past total_nodes sets NODE_COUNT - never reads past the targets") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(0x707a1);
  for (int W : {16, 32, 128}) {
    // cut 1: only the last request's segment ends past total_nodes (its count and
    // segment agree, so only the total_nodes bound catches it); cut n_last + 2: the
    // last request lies wholly past it and the one before ends past it.
    for (int extra_cut : {0, 2}) {
      const int B = 9;
      TreeAcceptInput in = random_trees(rng, B, W, 3);  // well-formed trees: only the cut makes errors
      in.target_tokens = kdtree::ref::random_accept_targets(rng, B, W, in.tokens, in.parents, in.node_counts, 0.9, 3);
      pack_targets(in);
      const int cut = extra_cut == 0 ? 1 : in.node_counts[B - 1] + extra_cut;
      in.target_tokens.resize(in.target_tokens.size() - cut);  // total_nodes = node_indptr[B] - cut
      INFO("tree_accept[W=" << W << ",B=" << B << "] packed, total_nodes = node_indptr[B] - " << cut);
      TreeAcceptOutput expect = kdtree::ref::tree_accept(in);
      CHECK(expect.request_errors[B - 1] == KDTREE_DEVICE_ERROR_NODE_COUNT);
      CHECK(expect.request_errors[B - 2] == (extra_cut ? KDTREE_DEVICE_ERROR_NODE_COUNT : 0));
      CHECK(expect.request_errors[0] == 0);
      run_case(rt, in, true);
      run_case(rt, in, false);
    }
  }
}
