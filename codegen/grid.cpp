#include "codegen/grid.hpp"

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/ops.hpp"
#include "codegen/verify_attention.hpp"

namespace kdtree::codegen {

std::vector<std::string> default_heads() {
  std::vector<std::string> names;
  for (const HeadShape& h : supported_heads()) names.push_back(h.name);
  return names;
}

namespace {

void require_nonempty(bool nonempty, const char* option) {
  if (!nonempty) fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("grid option '{}' is empty", option));
}

}  // namespace

std::vector<GridItem> enumerate_grid(const GridOptions& options, const Arch& arch) {
  require(options.attention || options.tree_ops, "grid is empty: both attention and tree operations are off");
  require_nonempty(!options.widths.empty(), "widths");
  require_nonempty(!options.page_sizes.empty(), "page_sizes");
  if (options.attention) {
    require_nonempty(!options.heads.empty(), "heads");
    require_nonempty(!options.dtypes.empty(), "dtypes");
    require_nonempty(!options.kv_dtypes.empty(), "kv_dtypes");
  }
  std::vector<GridItem> items;
  for (const OpInfo& op : operations()) {
    if (op.attention ? !options.attention : !options.tree_ops) continue;
    std::vector<GridItem> mine = op.grid(options, arch);
    items.insert(items.end(), std::make_move_iterator(mine.begin()), std::make_move_iterator(mine.end()));
  }
  return items;
}

}  // namespace kdtree::codegen
