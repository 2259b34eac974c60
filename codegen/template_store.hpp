// Templates are embedded into the library at build time (cmake/embed_templates.cmake),
// so an installed binary needs no template files. For development,
// KDTREE_TEMPLATE_DIR=<dir> makes the store read <dir>/<name> instead.
#pragma once
#include <string>
#include <vector>

namespace kdtree::codegen {

// Text of templates/<name>. Throws KDTREE_ERROR_INTERNAL naming the missing file.
std::string template_text(const std::string& name);

// Names of every embedded template.
std::vector<std::string> template_names();

}  // namespace kdtree::codegen
