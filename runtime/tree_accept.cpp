// kdtree_tree_accept: host validation (before any device use) and the launch:
// one warp per request. Tree shape, node counts and node_indptr live on the
// device and are checked there (KDTREE_DEVICE_ERROR_NODE_COUNT / _TREE in
// error_flags); total_nodes, the host-known bound of packed targets, is checked here.
#include <cstdint>

#include <fmt/format.h>

#include "codegen/tree_accept.hpp"
#include "runtime/arg_checks.hpp"
#include "runtime/tree_ops.hpp"
#include "tree_accept_params.h"

namespace kdtree {

void tree_accept(Engine& rt, const kdtree_tree_accept_args& a) {
  codegen::TreeAcceptSpec spec;
  spec.max_tree_nodes = a.max_tree_nodes;
  codegen::validate(spec);
  require(a.batch_size >= 1, "batch_size = {} must be >= 1", a.batch_size);
  require_buffer(a.tokens, 4, "tokens");
  require_buffer(a.parents, 4, "parents");
  require_buffer(a.node_counts, 4, "node_counts");
  require_buffer(a.target_tokens, 4, "target_tokens");
  require_optional_buffer(a.node_indptr, 4, "node_indptr");
  require_buffer(a.accepted_path, 4, "accepted_path");
  require_buffer(a.accept_lens, 4, "accept_lens");
  require_buffer(a.bonus_tokens, 4, "bonus_tokens");
  require_optional_buffer(a.error_flags, 4, "error_flags");
  require_disjoint({{a.accepted_path, size_t(a.batch_size) * a.max_tree_nodes * 4, "accepted_path"},
                    {a.accept_lens, size_t(a.batch_size) * 4, "accept_lens"},
                    {a.bonus_tokens, size_t(a.batch_size) * 4, "bonus_tokens"},
                    {a.error_flags, 4, "error_flags"}});
  if (a.node_indptr) {
    // The kernel bounds every packed target read by total_nodes (kdtree.h).
    require(a.total_nodes >= a.batch_size && a.total_nodes <= (long long)a.batch_size * a.max_tree_nodes,
            "total_nodes = {} is out of range with node_indptr: set it to node_indptr[batch_size], the length of "
            "the packed target_tokens ({}..{}: each of the {} requests has 1..{} nodes)",
            a.total_nodes, a.batch_size, (long long)a.batch_size * a.max_tree_nodes, a.batch_size, a.max_tree_nodes);
  }

  Module& module = rt.module(spec.fast_key(), [&] { return codegen::generate_tree_accept(spec, rt.arch()); });
  CUfunction fn = module.function("kdtree_tree_accept", 0);

  kdtree_tree_accept_params p{};
  p.tokens = a.tokens;
  p.parents = a.parents;
  p.node_counts = a.node_counts;
  p.target_tokens = a.target_tokens;
  p.node_indptr = a.node_indptr;
  p.accepted_path = a.accepted_path;
  p.accept_lens = a.accept_lens;
  p.bonus_tokens = a.bonus_tokens;
  p.error_flags = a.error_flags;
  p.batch_size = a.batch_size;
  p.total_nodes = a.node_indptr ? a.total_nodes : 0;
  void* args[] = {&p};

  LaunchDims dims;
  dims.grid_x = static_cast<unsigned>(a.batch_size);
  dims.block_x = static_cast<unsigned>(module.launch().threads);
  rt.launch(fn, dims, args, static_cast<CUstream>(a.stream), "tree_accept");
}

}  // namespace kdtree
