#include "codegen/tree_build.hpp"

#include <fmt/format.h>

#include "codegen/render.hpp"
#include "codegen/template_store.hpp"
#include "runtime/error.hpp"

namespace kdtree::codegen {

std::string TreeBuildSpec::label() const { return fmt::format("tree_build[W={}]", max_tree_nodes); }

std::string TreeBuildSpec::file_stem() const { return fmt::format("tree_build-W{}", max_tree_nodes); }

std::string TreeBuildSpec::fast_key() const { return file_stem(); }

void validate(const TreeBuildSpec& spec) {
  const int w = spec.max_tree_nodes;
  if (w != 16 && w != 32 && w != 64 && w != 128) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("tree_build: max_tree_nodes = {} is not supported: use 16, 32, 64 or 128", w));
  }
}

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
  KernelSource ks;
  ks.op = "tree_build";
  ks.label = spec.label();
  ks.file_stem = spec.file_stem();
  ks.source = template_text("tree_build_params.h") + "\n" +
              render("tree_build.cu", template_text("tree_build.cu"), params);
  ks.entry_points = {"kdtree_tree_build"};
  ks.options = {};  // the compiler adds the standard and ptxas options
  return ks;
}

}  // namespace kdtree::codegen
