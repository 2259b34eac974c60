// kdtree_tree_build: host validation (every argument, before any device use)
// and the launch: one warp per request.
#include <cstdint>

#include <fmt/format.h>

#include "codegen/tree_build.hpp"
#include "runtime/arg_checks.hpp"
#include "runtime/tree_ops.hpp"
#include "tree_build_params.h"

namespace kdtree {
namespace {

void require_range(int value, int lo, int hi, const char* name) {
  require(value >= lo && value <= hi, "{} = {} is out of range: must be {}..{}", name, value, lo, hi);
}

}  // namespace

void tree_build(Engine& rt, const kdtree_tree_build_args& a) {
  codegen::TreeBuildSpec spec;
  spec.max_tree_nodes = a.max_tree_nodes;
  codegen::validate(spec);
  require(a.batch_size >= 1, "batch_size = {} must be >= 1", a.batch_size);
  require_range(a.depth, 1, codegen::kTreeBuildMaxDepth, "depth");
  require_range(a.top_k, 1, codegen::kTreeBuildMaxTopK, "top_k");
  require(a.budget >= 1 && a.budget <= a.max_tree_nodes - 1,
          "budget = {} is out of range: must be 1..{} (max_tree_nodes - 1, the root takes a node)", a.budget,
          a.max_tree_nodes - 1);
  require_buffer(a.draft_tokens, 4, "draft_tokens");
  require_buffer(a.draft_logprobs, 4, "draft_logprobs");
  require_buffer(a.root_tokens, 4, "root_tokens");
  require_buffer(a.prefix_lens, 4, "prefix_lens");
  require_buffer(a.tokens, 4, "tokens");
  require_buffer(a.parents, 4, "parents");
  require_buffer(a.depths, 4, "depths");
  require_buffer(a.positions, 4, "positions");
  require_buffer(a.tree_mask, 8, "tree_mask");
  require_buffer(a.first_child, 4, "first_child");
  require_buffer(a.next_sibling, 4, "next_sibling");
  require_buffer(a.node_counts, 4, "node_counts");
  require_optional_buffer(a.scores, 4, "scores");
  const size_t bw = size_t(a.batch_size) * a.max_tree_nodes * 4;
  require_disjoint({{a.tokens, bw, "tokens"},
                    {a.parents, bw, "parents"},
                    {a.depths, bw, "depths"},
                    {a.positions, bw, "positions"},
                    {a.tree_mask, bw * 2 * ((a.max_tree_nodes + 63) / 64), "tree_mask"},
                    {a.first_child, bw, "first_child"},
                    {a.next_sibling, bw, "next_sibling"},
                    {a.node_counts, size_t(a.batch_size) * 4, "node_counts"},
                    {a.scores, bw, "scores"}});

  Module& module = rt.module(spec.fast_key(), [&] { return codegen::generate_tree_build(spec, rt.arch()); });
  CUfunction fn = module.function("kdtree_tree_build", 0);

  kdtree_tree_build_params p{};
  p.draft_tokens = a.draft_tokens;
  p.draft_logprobs = a.draft_logprobs;
  p.root_tokens = a.root_tokens;
  p.prefix_lens = a.prefix_lens;
  p.tokens = a.tokens;
  p.parents = a.parents;
  p.depths = a.depths;
  p.positions = a.positions;
  p.tree_mask = reinterpret_cast<unsigned long long*>(a.tree_mask);
  p.first_child = a.first_child;
  p.next_sibling = a.next_sibling;
  p.node_counts = a.node_counts;
  p.scores = a.scores;
  p.batch_size = a.batch_size;
  p.depth = a.depth;
  p.top_k = a.top_k;
  p.budget = a.budget;
  void* args[] = {&p};

  LaunchDims dims;
  dims.grid_x = static_cast<unsigned>(a.batch_size);
  dims.block_x = static_cast<unsigned>(module.launch().threads);
  rt.launch(fn, dims, args, static_cast<CUstream>(a.stream), "tree_build");
}

}  // namespace kdtree
