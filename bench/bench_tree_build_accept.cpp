// Times kdtree_tree_build and kdtree_tree_accept through the C ABI for
// B in {1, 8, 64} x W in {16, 32, 64, 128} (D = 8, K = 8, budget W - 1).
// Each call is bracketed by CUDA events (driver table); the median of many
// calls after warm-up is reported, with the back-to-back mean (launch-bound
// throughput). Prints a table and one JSON line per point. Exits 0 with a
// message when there is no GPU.
//
// usage: bench_tree_build_accept [iterations=200]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_support.hpp"
#include "kdtree/kdtree.h"
#include "reference/random_draft.hpp"
#include "reference/tree_build.hpp"
#include "runtime/driver.hpp"

using kdtree::bench::Buffer;
using kdtree::bench::check;
using kdtree::bench::check_cu;

namespace {

struct Timing {
  double median_us = 0, min_us = 0, back_to_back_us = 0;
};

// Median / min of per-call event pairs, then the mean of `iters` calls in a row.
template <typename Call>
Timing time_calls(CUstream stream, int iters, Call&& call) {
  const std::vector<double> us = kdtree::bench::per_call_us(stream, 20, iters, call);
  Timing t;
  t.median_us = kdtree::bench::median(us);
  t.min_us = us.front();
  t.back_to_back_us = kdtree::bench::back_to_back_us(stream, iters, call);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  if (!kdtree::bench::gpu_available("bench_tree_build_accept")) return 0;
  kdtree::bench::Session gpu;
  kdtree_runtime* rt = gpu.rt;
  const int sm = gpu.sm;
  CUstream stream = gpu.stream;
  const auto& api = kdtree::driver::api();

  const int D = 8, K = 8;
  std::mt19937_64 rng(2024);
  std::printf("kdtree %s, sm_%d, D=%d K=%d budget=W-1, %d iterations (median of per-call CUDA events)\n",
              kdtree_version(), sm, D, K, iters);
  std::printf("%4s %4s | %16s %16s %14s | %16s %16s %14s\n", "B", "W", "build median us", "build b2b us",
              "build min us", "accept median us", "accept b2b us", "accept min us");
  std::vector<std::string> json;
  for (int B : {1, 8, 64}) {
    for (int W : {16, 32, 64, 128}) {
      const int MW = (W + 63) / 64;
      const size_t rows = size_t(B) * W;
      kdtree::ref::TreeBuildInput in = kdtree::ref::random_draft(rng, B, D, K, W - 1, W);
      kdtree::ref::TreeBuildOutput expect = kdtree::ref::tree_build(in);
      Buffer draft_tokens(in.draft_tokens), draft_logprobs(in.draft_logprobs), root_tokens(in.root_tokens),
          prefix_lens(in.prefix_lens);
      Buffer tokens(rows * 4), parents(rows * 4), depths(rows * 4), positions(rows * 4), mask(rows * MW * 8),
          first_child(rows * 4), next_sibling(rows * 4), counts(size_t(B) * 4), scores(rows * 4);

      kdtree_tree_build_args b{};
      b.batch_size = B;
      b.depth = D;
      b.top_k = K;
      b.budget = W - 1;
      b.max_tree_nodes = W;
      b.draft_tokens = draft_tokens.as<const int32_t>();
      b.draft_logprobs = draft_logprobs.as<const float>();
      b.root_tokens = root_tokens.as<const int32_t>();
      b.prefix_lens = prefix_lens.as<const int32_t>();
      b.tokens = tokens.as<int32_t>();
      b.parents = parents.as<int32_t>();
      b.depths = depths.as<int32_t>();
      b.positions = positions.as<int32_t>();
      b.tree_mask = mask.as<uint64_t>();
      b.first_child = first_child.as<int32_t>();
      b.next_sibling = next_sibling.as<int32_t>();
      b.node_counts = counts.as<int32_t>();
      b.scores = scores.as<float>();
      b.stream = stream;
      Timing build = time_calls(stream, iters, [&] { check(kdtree_tree_build(rt, &b), "kdtree_tree_build"); });
      check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize");
      const bool build_ok = tokens.download<int32_t>(rows) == expect.tokens &&
                            parents.download<int32_t>(rows) == expect.parents &&
                            counts.download<int32_t>(B) == expect.node_counts;

      std::vector<int32_t> targets =
          kdtree::ref::random_accept_targets(rng, B, W, expect.tokens, expect.parents, expect.node_counts, 0.8);
      Buffer target_tokens(targets), path(rows * 4), lens(size_t(B) * 4), bonus(size_t(B) * 4),
          flags(std::vector<int32_t>{0});
      kdtree_tree_accept_args a{};
      a.batch_size = B;
      a.max_tree_nodes = W;
      a.tokens = tokens.as<const int32_t>();
      a.parents = parents.as<const int32_t>();
      a.node_counts = counts.as<const int32_t>();
      a.target_tokens = target_tokens.as<const int32_t>();
      a.accepted_path = path.as<int32_t>();
      a.accept_lens = lens.as<int32_t>();
      a.bonus_tokens = bonus.as<int32_t>();
      a.error_flags = flags.as<int32_t>();
      a.stream = stream;
      Timing accept = time_calls(stream, iters, [&] { check(kdtree_tree_accept(rt, &a), "kdtree_tree_accept"); });
      check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize");
      const bool accept_ok = flags.download<int32_t>(1)[0] == 0;

      std::printf("%4d %4d | %16.2f %16.2f %14.2f | %16.2f %16.2f %14.2f%s\n", B, W, build.median_us,
                  build.back_to_back_us, build.min_us, accept.median_us, accept.back_to_back_us, accept.min_us,
                  build_ok && accept_ok ? "" : "  (MISMATCH vs reference)");
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"tree_build\",\"sm\":%d,\"B\":%d,\"W\":%d,\"D\":%d,\"K\":%d,\"budget\":%d,"
                    "\"median_us\":%.3f,\"min_us\":%.3f,\"back_to_back_us\":%.3f,\"matches_reference\":%s}",
                    sm, B, W, D, K, W - 1, build.median_us, build.min_us, build.back_to_back_us,
                    build_ok ? "true" : "false");
      json.emplace_back(line);
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"tree_accept\",\"sm\":%d,\"B\":%d,\"W\":%d,\"median_us\":%.3f,\"min_us\":%.3f,"
                    "\"back_to_back_us\":%.3f,\"error_flags_clear\":%s}",
                    sm, B, W, accept.median_us, accept.min_us, accept.back_to_back_us, accept_ok ? "true" : "false");
      json.emplace_back(line);
    }
  }
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  return 0;
}
