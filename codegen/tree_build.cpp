#include "codegen/tree_build.hpp"

#include <fmt/format.h>

#include "codegen/tree_ops_common.hpp"

namespace kdtree::codegen {

std::string TreeBuildSpec::label() const { return fmt::format("tree_build[W={}]", max_tree_nodes); }

std::string TreeBuildSpec::file_stem() const { return fmt::format("tree_build-W{}", max_tree_nodes); }

std::string TreeBuildSpec::fast_key() const { return file_stem(); }

void validate(const TreeBuildSpec& spec) { validate_tree_width("tree_build", spec.max_tree_nodes); }

KernelSource generate_tree_build(const TreeBuildSpec& spec, const Arch& arch) {
  validate(spec);
  (void)arch;  // one warp per request and < 8 KB of shared memory fit every sm_80+ part
  const int w = spec.max_tree_nodes;
  Params params{
      {"MAX_TREE_NODES", std::to_string(w)},
      {"SLOTS_PER_LANE", std::to_string((w + 31) / 32)},
      {"MASK_WORDS", std::to_string((w + 63) / 64)},
      {"MAX_DEPTH", std::to_string(kTreeBuildMaxDepth)},
      {"MAX_TOP_K", std::to_string(kTreeBuildMaxTopK)},
  };
  return tree_op_source("tree_build", spec.label(), spec.file_stem(), params, kTreeBuildThreads);
}

}  // namespace kdtree::codegen
