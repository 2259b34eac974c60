// tree_allocate (the batch's draft nodes allocated over its requests): spec
// validation and source generation.
#pragma once
#include <string>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"

namespace kdtree::codegen {

// One CTA for the whole batch (the template's __launch_bounds__).
inline constexpr int kTreeAllocateThreads = 1024;
// The most requests one call takes: the CTA keeps four words per request in
// static shared memory (33 KB in all).
inline constexpr int kTreeAllocateMaxBatch = 2048;

struct TreeAllocateSpec {
  int max_tree_nodes = 64;  // W: the scores' row stride

  std::string label() const;      // "tree_allocate[W=64]"
  std::string file_stem() const;  // "tree_allocate-W64"
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED naming the supported widths (16, 32, 64, 128).
void validate(const TreeAllocateSpec& spec);

// Source with entry point "kdtree_tree_allocate": one CTA of
// kTreeAllocateThreads threads, static shared memory only.
KernelSource generate_tree_allocate(const TreeAllocateSpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
