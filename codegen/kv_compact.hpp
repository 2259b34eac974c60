// kv_compact: spec validation and source generation. The kernel copies 16-bit
// rows bit for bit, so the dtype is not part of the key; row sizes, layer and
// batch counts are run-time values.
#pragma once
#include <string>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

struct KvCompactSpec {
  int page_size = 64;
  int max_tree_nodes = 64;

  // "kv_compact[W=64,page=16]"
  std::string label() const;
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED unless page_size is in {1, 16, 32, 64, 128}
// and max_tree_nodes in {16, 32, 64, 128}.
void validate(const KvCompactSpec& spec);

// The kernel's tiling: CTA threads, 16-byte vectors per row chunk (a CTA's
// columns) and vectors each thread holds per read-then-write round.
constexpr int kKvCompactThreads = 128;
constexpr int kKvCompactChunkVecs = 32;
constexpr int kKvCompactVecsPerThread = 4;

// Source with entry point "kdtree_kv_compact".
KernelSource generate_kv_compact(const KvCompactSpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
