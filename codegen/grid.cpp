#include "codegen/grid.hpp"

#include <set>

#include <fmt/format.h>

#include "codegen/kv_compact.hpp"
#include "codegen/sample_tokens.hpp"
#include "codegen/tree_accept.hpp"
#include "codegen/tree_build.hpp"
#include "codegen/verify_attention.hpp"
#include "base/error.hpp"

namespace kdtree::codegen {
namespace {

// Appends unless an item with the same label is already there, so repeated
// option values (--widths 16,16) do not compile a kernel twice.
void add(std::vector<GridItem>& items, std::set<std::string>& seen, std::string label,
         std::function<KernelSource()> make) {
  if (seen.insert(label).second) items.push_back(GridItem{std::move(label), std::move(make)});
}

void require_nonempty(bool nonempty, const char* option) {
  if (!nonempty) fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("grid option '{}' is empty", option));
}

}  // namespace

std::vector<GridItem> enumerate_grid(const GridOptions& options, const Arch& arch) {
  require(options.attention || options.tree_ops, "grid is empty: both attention and tree operations are off");
  require_nonempty(!options.widths.empty(), "widths");
  require_nonempty(!options.page_sizes.empty(), "page_sizes");
  std::vector<GridItem> items;
  std::set<std::string> seen;

  if (options.attention) {
    require_nonempty(!options.heads.empty(), "heads");
    require_nonempty(!options.dtypes.empty(), "dtypes");
    for (const std::string& head : options.heads) {
      kdtree_verify_spec c{};
      parse_head_name(head, &c.head_dim_qk, &c.head_dim_v);
      // Head counts are run-time values; any consistent pair passes validation.
      c.num_q_heads = 16;
      c.num_kv_heads = c.head_dim_qk == 576 ? 1 : 2;
      for (int width : options.widths) {
        for (int page : options.page_sizes) {
          for (kdtree_dtype dtype : options.dtypes) {
            c.max_tree_nodes = width;
            c.page_size = page;
            c.dtype = dtype;
            VerifySpec spec = validate_verify_spec(c);
            add(items, seen, spec.label(), [spec, arch] { return generate_verify_attention(spec, arch); });
          }
        }
      }
    }
  }

  if (options.tree_ops) {
    for (int width : options.widths) {
      TreeBuildSpec build{};
      build.max_tree_nodes = width;
      validate(build);
      add(items, seen, build.label(), [build, arch] { return generate_tree_build(build, arch); });

      TreeAcceptSpec accept{};
      accept.max_tree_nodes = width;
      validate(accept);
      add(items, seen, accept.label(), [accept, arch] { return generate_tree_accept(accept, arch); });

      for (int page : options.page_sizes) {
        KvCompactSpec compact{};
        compact.page_size = page;
        compact.max_tree_nodes = width;
        validate(compact);
        add(items, seen, compact.label(), [compact, arch] { return generate_kv_compact(compact, arch); });
      }
    }
    // Sampling does not depend on the tree shape: one kernel per logits dtype.
    for (kdtree_dtype logits : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
      SampleSpec sample{};
      sample.logits_dtype = logits;
      validate(sample);
      add(items, seen, sample.label(), [sample, arch] { return generate_sample_tokens(sample, arch); });
    }
  }
  return items;
}

}  // namespace kdtree::codegen
