// Host side of verify_attention: argument checks, the split plan, and launches.
#pragma once
#include <cstddef>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
#include "kdtree/kdtree.h"
#include "runtime/runtime.hpp"

namespace kdtree {

struct VerifyPlan {
  int num_splits = 1;
  int split_tokens = 0;  // KV tokens per split (a multiple of the tile)
  // > 0: stream-K (kernels with LaunchFacts::stream_k, automatic splits): this many
  // CTAs share all KV tiles evenly (num_splits 1; templates/verify_attention_common.cuh).
  int stream_ctas = 0;
  // > 1: the num_splits splits of a row tile run as one thread-block cluster along z
  // and merge in shared memory (KDTREE_VERIFY_SCHEDULE=cluster): no workspace, no combine.
  int cluster_splits = 0;
  size_t workspace_bytes = 0;
  // The grids launched: the main kernel's x covers max_tree_nodes rows of a
  // (request, KV head) (CTAs past a request's rows exit at once), y the requests x
  // KV heads, z num_splits; stream-K a 1-D grid of stream_ctas. The combine runs
  // only with more than one split or stream-K CTA: uniform splits on a grid of
  // (row blocks of a request, requests), stream-K on a 1-D grid.
  unsigned grid_x = 0, grid_y = 0, grid_z = 1;
  unsigned combine_grid_x = 0, combine_grid_y = 1;
  // sm_90+: shared memory the combine requests and does not use, so that when it is
  // launched overlapped with the main kernel (programmatic dependent launch) an SM
  // takes at most its even share of the combine's CTAs; 0 elsewhere.
  unsigned combine_dynamic_smem = 0;
};

// The host-known sizes of a call (batch_size, total_nodes, max_kv_len, a forced
// num_splits, and the grid limits they imply), checked before anything reads
// them. Throws KDTREE_ERROR_INVALID_ARGUMENT naming the value.
// e4m3 caches: k_scale and v_scale positive and finite; 16-bit caches: each 0
// or 1. KDTREE_ERROR_INVALID_ARGUMENT naming the scale and its value otherwise.
void check_kv_scales(bool kv_fp8, float k_scale, float v_scale);

void check_verify_sizes(const kdtree_verify_spec& spec, int max_tree_nodes, int batch_size, int total_nodes,
                        int max_kv_len, int num_splits);

// Where the parts of a call's workspace start, in bytes (templates/verify_attention_layout.h
// says the layout the kernels read): partial O at 0, partial LSE, and stream-K's cut
// records; bytes 0 when the plan needs none.
struct VerifyWorkspace {
  size_t partial_lse = 0, cut_items = 0;
  size_t bytes = 0;
};
// Of a call with this many uniform KV splits (none for one split).
VerifyWorkspace verify_workspace(const kdtree_verify_spec& spec, int total_nodes, int num_splits);
// Of a stream-K call: two partial slots of block_m rows per CTA, and a cut record per CTA.
VerifyWorkspace verify_stream_workspace(const kdtree_verify_spec& spec, int block_m, int stream_ctas);
size_t verify_workspace_bytes(const kdtree_verify_spec& spec, int total_nodes, int num_splits);
size_t verify_stream_workspace_bytes(const kdtree_verify_spec& spec, int block_m, int stream_ctas);

// The split plan for checked sizes and the generated kernel's launch facts;
// forced_splits > 0 overrides the choice. With automatic splits a stream-K kernel
// gets stream-K or uniform splits, whichever the cost model prefers;
// KDTREE_VERIFY_SCHEDULE=stream or =splits forces one, =cluster uniform splits merged
// in a thread-block cluster (kernels with LaunchFacts::cluster_merge, sm_90+; a forced
// num_splits up to KDTREE_MAX_CLUSTER_SPLITS); anything else is an INVALID_ARGUMENT
// naming the variable.
VerifyPlan plan_verify(const codegen::LaunchFacts& launch, const codegen::Arch& arch, const kdtree_verify_spec& spec,
                       int batch_size, int total_nodes, int max_kv_len, int forced_splits);

void verify_attention(Engine& rt, const kdtree_verify_args& args);

// kdtree_verify_workspace_size: the workspace of the automatic split plan.
size_t verify_workspace_size(Engine& rt, const kdtree_verify_spec& spec, int batch_size, int total_nodes,
                             int max_kv_len);

// kdtree_warm: compiles (device runtime: and loads) the spec's kernels.
void warm_verify(Engine& rt, const kdtree_verify_spec& spec);

}  // namespace kdtree
