// Host side of the tree operations: argument checks and launches. The extern "C"
// entry points in kdtree.h forward here; C++ callers may call these directly.
#pragma once
#include "kdtree/kdtree.h"
#include "runtime/runtime.hpp"

namespace kdtree {

// DDTree best-first selection for the whole batch in one launch.
void tree_build(Engine& rt, const kdtree_tree_build_args& args);

// Longest accepted path per request, in one launch.
void tree_accept(Engine& rt, const kdtree_tree_accept_args& args);

// The batch's draft nodes allocated over its requests, in one launch.
void tree_allocate(Engine& rt, const kdtree_tree_allocate_args& args);

// One token per logits row: greedy argmax or Gumbel-max sampling with a seed.
void sample_tokens(Engine& rt, const kdtree_sample_args& args);

// Moves the accepted path's KV rows into place, every layer in one launch.
void kv_compact(Engine& rt, const kdtree_kv_compact_args& args);

}  // namespace kdtree
