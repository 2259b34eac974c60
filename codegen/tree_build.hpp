// tree_build (DDTree best-first selection): spec validation and source generation.
#pragma once
#include <string>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"

namespace kdtree::codegen {

// Run-time limits of tree_build's inputs (the kernel's shared memory holds one
// request's [D, K] log-probs; a rank path packs 6 bits per depth).
inline constexpr int kTreeBuildMaxDepth = 16;
inline constexpr int kTreeBuildMaxTopK = 64;
// One warp per request (the template's __launch_bounds__(32)).
inline constexpr int kTreeBuildThreads = 32;

struct TreeBuildSpec {
  int max_tree_nodes = 64;  // W

  std::string label() const;      // "tree_build[W=64]"
  std::string file_stem() const;  // "tree_build-W64"
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED naming the supported widths (16, 32, 64, 128).
void validate(const TreeBuildSpec& spec);

// Source with entry point "kdtree_tree_build": one warp (32 threads) per
// request, grid = batch size, static shared memory only.
KernelSource generate_tree_build(const TreeBuildSpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
