// kdtree_tree_allocate: host validation (before any device use) and the launch:
// one CTA for the batch. The scores' order lives on the device and is checked
// there (KDTREE_DEVICE_ERROR_SCORES in error_flags).
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "codegen/tree_allocate.hpp"
#include "runtime/arg_checks.hpp"
#include "runtime/tree_ops.hpp"
#include "tree_allocate_params.h"

namespace kdtree {

void tree_allocate(Engine& rt, const kdtree_tree_allocate_args& a) {
  codegen::TreeAllocateSpec spec;
  spec.max_tree_nodes = a.max_tree_nodes;
  codegen::validate(spec);
  require(a.batch_size >= 1 && a.batch_size <= codegen::kTreeAllocateMaxBatch, "batch_size = {} must be 1..{}",
          a.batch_size, codegen::kTreeAllocateMaxBatch);
  require(a.cap >= 1 && a.cap < a.max_tree_nodes,
          "cap = {} must be 1..{} (max_tree_nodes less the root: the draft nodes a request's tree has)", a.cap,
          a.max_tree_nodes - 1);
  const long long rows = (long long)a.batch_size + a.total;
  require(a.total >= 0 && a.total <= (long long)a.batch_size * a.cap,
          "total = {} must be 0..{} (batch_size {} x cap {}): the draft nodes the batch's trees have", a.total,
          (long long)a.batch_size * a.cap, a.batch_size, a.cap);
  require(std::isfinite(a.urgency) && a.urgency >= 0.0f, "urgency = {} must be finite and >= 0", a.urgency);
  require_buffer(a.scores, 4, "scores");
  require_optional_buffer(a.active, 1, "active");
  require_optional_buffer(a.remaining, 4, "remaining");
  require_buffer(a.node_counts, 4, "node_counts");
  require_buffer(a.node_indptr, 4, "node_indptr");
  require_buffer(a.row_req, 8, "row_req");
  require_buffer(a.row_node, 8, "row_node");
  require_optional_buffer(a.error_flags, 4, "error_flags");
  require_disjoint({{a.node_counts, size_t(a.batch_size) * 4, "node_counts"},
                    {a.node_indptr, size_t(a.batch_size + 1) * 4, "node_indptr"},
                    {a.row_req, size_t(rows) * 8, "row_req"},
                    {a.row_node, size_t(rows) * 8, "row_node"},
                    {a.error_flags, 4, "error_flags"}});

  Module& module = rt.module(spec.fast_key(), [&] { return codegen::generate_tree_allocate(spec, rt.arch()); });
  CUfunction fn = module.function("kdtree_tree_allocate", 0);

  kdtree_tree_allocate_params p{};
  p.scores = a.scores;
  p.active = a.active;
  p.remaining = a.remaining;
  p.node_counts = a.node_counts;
  p.node_indptr = a.node_indptr;
  p.row_req = reinterpret_cast<long long*>(a.row_req);
  p.row_node = reinterpret_cast<long long*>(a.row_node);
  p.error_flags = a.error_flags;
  p.urgency = a.urgency;
  p.batch_size = a.batch_size;
  p.cap = a.cap;
  p.total = a.total;
  void* args[] = {&p};

  LaunchDims dims;
  dims.grid_x = 1;
  dims.block_x = static_cast<unsigned>(module.launch().threads);
  rt.launch(fn, dims, args, static_cast<CUstream>(a.stream), "tree_allocate");
}

}  // namespace kdtree
