#include "codegen/tree_accept.hpp"

#include <fmt/format.h>

#include "codegen/render.hpp"
#include "codegen/template_store.hpp"
#include "kdtree/kdtree.h"
#include "runtime/error.hpp"

namespace kdtree::codegen {

std::string TreeAcceptSpec::label() const { return fmt::format("tree_accept[W={}]", max_tree_nodes); }

std::string TreeAcceptSpec::file_stem() const { return fmt::format("tree_accept-W{}", max_tree_nodes); }

std::string TreeAcceptSpec::fast_key() const { return file_stem(); }

void validate(const TreeAcceptSpec& spec) {
  const int w = spec.max_tree_nodes;
  if (w != 16 && w != 32 && w != 64 && w != 128) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("tree_accept: max_tree_nodes = {} is not supported: use 16, 32, 64 or 128", w));
  }
}

KernelSource generate_tree_accept(const TreeAcceptSpec& spec, const Arch& arch) {
  validate(spec);
  (void)arch;  // one warp per request and < 4 KB of shared memory fit every sm_80+ part
  const int w = spec.max_tree_nodes;
  Params params{
      {"MAX_TREE_NODES", std::to_string(w)},
      {"NODES_PER_LANE", std::to_string((w + 31) / 32)},
      // The device error bits come from kdtree.h so the kernel cannot drift from the ABI.
      {"ERROR_NODE_COUNT", std::to_string(KDTREE_DEVICE_ERROR_NODE_COUNT)},
      {"ERROR_TREE", std::to_string(KDTREE_DEVICE_ERROR_TREE)},
  };
  KernelSource ks;
  ks.op = "tree_accept";
  ks.label = spec.label();
  ks.file_stem = spec.file_stem();
  ks.source = template_text("tree_accept_params.h") + "\n" +
              render("tree_accept.cu", template_text("tree_accept.cu"), params);
  ks.entry_points = {"kdtree_tree_accept"};
  ks.options = {};  // the compiler adds the standard and ptxas options
  return ks;
}

}  // namespace kdtree::codegen
