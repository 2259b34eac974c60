// What the generators of the tree operations (tree_build, tree_accept,
// sample_tokens, kv_compact) share: the supported tree widths and the shape of
// their source (a params header plus one rendered kernel with one entry point).
#pragma once
#include <string>

#include "codegen/kernel_source.hpp"
#include "codegen/render.hpp"
#include "codegen/shapes.hpp"

namespace kdtree::codegen {

// Throws KDTREE_ERROR_UNSUPPORTED: "<op>: max_tree_nodes = W is not supported:
// use 16, 32, 64 or 128".
void validate_tree_width(const char* op, int max_tree_nodes);

// templates/<op>.cu with `params` as its configuration (set_template_source);
// the entry point is "kdtree_<op>", launched with `threads` threads per CTA and
// static shared memory only.
KernelSource tree_op_source(const std::string& op, const std::string& label, const std::string& file_stem,
                            const Params& params, int threads);

}  // namespace kdtree::codegen
