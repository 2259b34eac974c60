// Host side of verify_attention: argument checks, the split plan, and launches.
#pragma once
#include <cstddef>

#include "kdtree/kdtree.h"
#include "runtime/runtime.hpp"

namespace kdtree {

struct VerifyPlan {
  int num_splits = 1;
  int split_tokens = 0;  // KV tokens per split (multiple of the tile)
  size_t workspace_bytes = 0;
};

// The split plan for host-known sizes; forced_splits > 0 overrides the choice.
VerifyPlan plan_verify(Runtime& rt, const kdtree_verify_spec& spec, int batch_size, int total_nodes,
                       int max_kv_len, int forced_splits);

void verify_attention(Runtime& rt, const kdtree_verify_args& args);

}  // namespace kdtree
