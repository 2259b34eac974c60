#include "codegen/tree_ops_common.hpp"

#include <fmt/format.h>

#include "base/error.hpp"

namespace kdtree::codegen {

void validate_tree_width(const char* op, int w) {
  if (!is_supported_tree_width(w)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("{}: max_tree_nodes = {} is not supported: use {}", op, w, supported_widths_text()));
  }
}

KernelSource tree_op_source(const std::string& op, const std::string& label, const std::string& file_stem,
                            const Params& params, int threads) {
  KernelSource ks;
  ks.op = op;
  ks.label = label;
  ks.file_stem = file_stem;
  set_template_source(ks, op, params);
  ks.entry_points = {"kdtree_" + op};
  ks.launch.threads = threads;
  return ks;  // no options: the compiler adds the standard and ptxas ones
}

}  // namespace kdtree::codegen
