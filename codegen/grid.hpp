// The grid of kernels `kdtree-gen warm` compiles: by default MLA 576/512 and GQA
// 64/128/256 x tree widths 16..128 x page sizes 1/16/64 x bf16/f16 x KV caches
// as_q/e4m3, plus the tree operations for the same widths and page sizes.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
#include "codegen/shapes.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

// Every name of supported_heads().
std::vector<std::string> default_heads();

struct GridOptions {
  // Every head and width of codegen/shapes.hpp; the common page sizes.
  std::vector<std::string> heads{default_heads()};
  std::vector<int> widths{supported_widths()};
  std::vector<int> page_sizes{1, 16, 64};
  std::vector<kdtree_dtype> dtypes{KDTREE_DTYPE_BF16, KDTREE_DTYPE_F16};
  std::vector<kdtree_kv_dtype> kv_dtypes{supported_kv_dtypes()};  // verify_attention's caches
  bool attention = true;
  bool tree_ops = true;
};

struct GridItem {
  std::string label;                   // e.g. "verify_attention[gqa128,W=32,page=16,f16]"
  std::function<KernelSource()> make;  // renders the source (validated up front)
};

// Every kernel of the grid, validated; throws on an unsupported value.
std::vector<GridItem> enumerate_grid(const GridOptions& options, const Arch& arch);

}  // namespace kdtree::codegen
