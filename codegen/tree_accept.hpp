// tree_accept (longest accepted path of a draft tree): spec validation and
// source generation.
#pragma once
#include <string>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"

namespace kdtree::codegen {

// One warp per request (the template's __launch_bounds__(32)).
inline constexpr int kTreeAcceptThreads = 32;

struct TreeAcceptSpec {
  int max_tree_nodes = 64;  // W

  std::string label() const;      // "tree_accept[W=64]"
  std::string file_stem() const;  // "tree_accept-W64"
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED naming the supported widths (16, 32, 64, 128).
void validate(const TreeAcceptSpec& spec);

// Source with entry point "kdtree_tree_accept": one warp (32 threads) per
// request, grid = batch size, static shared memory only.
KernelSource generate_tree_accept(const TreeAcceptSpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
