// The registry of operations kdtree generates kernels for. The warm grid and
// kdtree-gen's emit both read it, so an operation is listed in one place: its
// name, whether it is an attention kernel or a tree operation, the kernels it
// contributes to a grid, and the kernel of one point.
#pragma once
#include <string>
#include <vector>

#include "codegen/arch.hpp"
#include "codegen/grid.hpp"
#include "codegen/kernel_source.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

// One point of the axes a kernel is specialised on; each operation reads the
// axes it has (tree_build: width only; sample_tokens: dtype = the logits dtype).
struct OpPoint {
  std::string head = "mla576/512";  // verify_attention: a head name (parse_head_name)
  int width = 64;                   // max_tree_nodes
  int page = 64;                    // page_size
  kdtree_dtype dtype = KDTREE_DTYPE_BF16;
  kdtree_kv_dtype kv_dtype = KDTREE_KV_DTYPE_AS_Q;  // verify_attention: the caches
};

struct OpInfo {
  const char* name;  // "verify_attention", "tree_build", ...
  bool attention;    // GridOptions::attention selects it; otherwise GridOptions::tree_ops
  // This operation's kernels of a grid, validated, each label once.
  std::vector<GridItem> (*grid)(const GridOptions& options, const Arch& arch);
  // The kernel of one point; throws KDTREE_ERROR_UNSUPPORTED for a value it does not take.
  KernelSource (*generate)(const OpPoint& point, const Arch& arch);
  // The OpPoint axes it reads, by their kdtree-gen flag names ("--head", "--width", ...).
  std::vector<std::string> axes;
};

// Every operation, in the order the grid lists them.
const std::vector<OpInfo>& operations();

// The names of operations(), in order.
std::vector<std::string> operation_names();

// The operation called `name`; throws KDTREE_ERROR_UNSUPPORTED listing the names.
const OpInfo& find_operation(const std::string& name);

}  // namespace kdtree::codegen
