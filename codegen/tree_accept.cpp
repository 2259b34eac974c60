#include "codegen/tree_accept.hpp"

#include <fmt/format.h>

#include "codegen/tree_ops_common.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

std::string TreeAcceptSpec::label() const { return fmt::format("tree_accept[W={}]", max_tree_nodes); }

std::string TreeAcceptSpec::file_stem() const { return fmt::format("tree_accept-W{}", max_tree_nodes); }

std::string TreeAcceptSpec::fast_key() const { return file_stem(); }

void validate(const TreeAcceptSpec& spec) { validate_tree_width("tree_accept", spec.max_tree_nodes); }

KernelSource generate_tree_accept(const TreeAcceptSpec& spec, const Arch& arch) {
  validate(spec);
  (void)arch;  // one warp per request and < 4 KB of shared memory fit every sm_80+ part
  const int w = spec.max_tree_nodes;
  Params params{
      {"MAX_TREE_NODES", std::to_string(w)},
      {"NODES_PER_LANE", std::to_string((w + 31) / 32)},
  };
  return tree_op_source("tree_accept", spec.label(), spec.file_stem(), params, kTreeAcceptThreads);
}

}  // namespace kdtree::codegen
