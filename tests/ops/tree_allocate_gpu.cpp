// tree_allocate on the GPU against the CPU reference: random batches of sorted
// scores with coarse steps (ties within and across requests), requests not
// decoding, remaining-token weights, every width, cap and total from 0 to B x cap,
// batches of 1 to 2048; NaN and increasing scores (error bit, roots only). The
// outputs are poisoned first (DeviceBuffer).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/random_allocate.hpp"
#include "reference/tree_allocate.hpp"
#include "runtime/runtime.hpp"
#include "runtime/tree_ops.hpp"
#include "tests/support/device.hpp"
#include "tests/support/gpu_fixture.hpp"

using kdtree::ref::TreeAllocateInput;
using kdtree::ref::TreeAllocateOutput;
using kdtree::test::DeviceBuffer;
using kdtree::test::Gpu;

namespace {

const char* const kTempDir = "kdtree-tree-allocate-gpu";

TreeAllocateInput random_batch(std::mt19937_64& rng, int B, int W, int cap, bool active, bool remaining) {
  return kdtree::ref::random_allocate_input(rng, B, W, cap, active, remaining, /*junk_past_cap=*/true);
}

// The device's logf and the host's may differ in the last bit, which can reorder two nodes whose keys differ
// by no more: then the kernel's choice must still be a valid one under the reference's keys (within `tol`).
void check_counts(const TreeAllocateInput& in, const TreeAllocateOutput& expect, const std::vector<int32_t>& got,
                  float tol) {
  if (got == expect.node_counts) return;
  REQUIRE(tol > 0.0f);
  const kdtree::ref::AllocationSpan span = kdtree::ref::allocation_span(expect, in.cap, got);
  REQUIRE(span.fewest >= 0);
  REQUIRE(span.most <= in.cap);
  CHECK(span.drafts == in.total);
  CHECK(span.lowest_taken >= span.highest_left - tol * std::max(1.0f, std::fabs(span.highest_left)));
}

void run_case(kdtree::Engine& rt, const TreeAllocateInput& in, bool with_flags = true) {
  const int B = in.batch_size;
  const size_t rows = size_t(B) + in.total;
  const TreeAllocateOutput expect = kdtree::ref::tree_allocate(in);
  DeviceBuffer scores(in.scores);
  DeviceBuffer active = in.active.empty() ? DeviceBuffer() : DeviceBuffer(in.active);
  DeviceBuffer remaining = in.remaining.empty() ? DeviceBuffer() : DeviceBuffer(in.remaining);
  DeviceBuffer counts(size_t(B) * 4), indptr(size_t(B + 1) * 4), req(rows * 8), node(rows * 8);
  DeviceBuffer flags(std::vector<int32_t>{0});

  kdtree_tree_allocate_args a{};
  a.batch_size = B;
  a.max_tree_nodes = in.max_tree_nodes;
  a.cap = in.cap;
  a.total = in.total;
  a.scores = scores.get<const float>();
  a.active = in.active.empty() ? nullptr : active.get<const uint8_t>();
  a.remaining = in.remaining.empty() ? nullptr : remaining.get<const int32_t>();
  a.urgency = in.urgency;
  a.node_counts = counts.get<int32_t>();
  a.node_indptr = indptr.get<int32_t>();
  a.row_req = req.get<int64_t>();
  a.row_node = node.get<int64_t>();
  a.error_flags = with_flags ? flags.get<int32_t>() : nullptr;
  kdtree::tree_allocate(rt, a);

  const std::vector<int32_t> got = counts.download<int32_t>();
  const bool weighted = !in.remaining.empty() && in.urgency > 0.0f;
  check_counts(in, expect, got, weighted ? 1e-5f : 0.0f);
  // The packing follows the counts the kernel chose.
  std::vector<int32_t> ptr(B + 1, 0);
  std::vector<int64_t> want_req(rows, 0), want_node(rows, 0);
  for (int b = 0; b < B; ++b) {
    ptr[b + 1] = ptr[b] + got[b];
    for (int i = 0; i < got[b] && size_t(ptr[b] + i) < rows; ++i) {
      want_req[ptr[b] + i] = b;
      want_node[ptr[b] + i] = i;
    }
  }
  CHECK(indptr.download<int32_t>() == ptr);
  CHECK(req.download<int64_t>() == want_req);
  CHECK(node.download<int64_t>() == want_node);
  if (with_flags) CHECK(flags.download<int32_t>()[0] == expect.error_flags);
}

}  // namespace

TEST_CASE("tree_allocate GPU: random batches against the reference") {
  Gpu gpu(kTempDir);
  kdtree::Engine& rt = gpu.rt;
  std::mt19937_64 rng(0xa11c);
  for (int W : {16, 32, 64, 128}) {
    for (int trial = 0; trial < 12; ++trial) {
      const int B = trial == 0 ? 1 : trial == 1 ? 64 : trial == 2 ? 333 : 1 + int(rng() % 80);
      const int cap = trial == 1 ? W - 1 : 1 + int(rng() % (W - 1));
      const bool active = trial % 2 == 0, remaining = trial % 3 != 1;
      TreeAllocateInput in = random_batch(rng, B, W, cap, active, remaining);
      if (trial == 3) in.total = 0;
      if (trial == 4) in.total = B * cap;
      INFO("tree_allocate[W=" << W << ",B=" << B << "] cap " << cap << " total " << in.total
                              << (active ? " active" : "") << (remaining ? " weighted" : ""));
      run_case(rt, in);
    }
  }
}

TEST_CASE("tree_allocate GPU: the largest batch, 2048 requests") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(0xb16);
  TreeAllocateInput in = random_batch(rng, 2048, 64, 63, true, true);
  INFO("tree_allocate[W=64,B=2048] cap 63 total " << in.total);
  run_case(gpu.rt, in);
}

TEST_CASE("tree_allocate GPU: a NaN or increasing score sets SCORES - roots only") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(0xbad5);
  for (int W : {16, 128}) {
    for (int kind = 0; kind < 2; ++kind) {
      TreeAllocateInput in = random_batch(rng, 9, W, W - 1, true, true);
      in.total = std::max(in.total, 5);
      float& x = in.scores[size_t(4) * W + 3];
      x = kind == 0 ? std::nanf("") : in.scores[size_t(4) * W + 2] + 1.0f;
      INFO("tree_allocate[W=" << W << ",B=9] " << (kind == 0 ? "NaN" : "increasing") << " score");
      REQUIRE(kdtree::ref::tree_allocate(in).error_flags == KDTREE_DEVICE_ERROR_SCORES);
      run_case(gpu.rt, in, true);
      run_case(gpu.rt, in, false);
    }
  }
}
