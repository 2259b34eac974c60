// Host side of verify_attention: argument checks, the split plan, and launches.
#pragma once
#include <cstddef>

#include "codegen/verify_attention.hpp"
#include "kdtree/kdtree.h"
#include "runtime/runtime.hpp"

namespace kdtree {

struct VerifyPlan {
  codegen::VerifyTiles tiles;  // the generated kernel's tiles for the runtime's arch
  int num_splits = 1;
  int split_tokens = 0;  // KV tokens per split (multiple of the tile)
  size_t workspace_bytes = 0;
};

// Workspace of a call with this many KV splits (0 for one split).
size_t verify_workspace_bytes(const kdtree_verify_spec& spec, int total_nodes, int num_splits);

// The split plan for host-known sizes; forced_splits > 0 overrides the choice.
VerifyPlan plan_verify(Runtime& rt, const kdtree_verify_spec& spec, int batch_size, int total_nodes,
                       int max_kv_len, int forced_splits);

void verify_attention(Runtime& rt, const kdtree_verify_args& args);

}  // namespace kdtree
