#include "codegen/template_store.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "base/error.hpp"

namespace kdtree::codegen {

// Defined in the build-generated templates_embedded.cpp.
struct EmbeddedTemplate {
  const char* name;
  const char* text;
};
extern const EmbeddedTemplate kEmbeddedTemplates[];
extern const int kEmbeddedTemplateCount;

std::string template_text(const std::string& name) {
  // Public headers ("kdtree/...") are embedded as the library was built, never
  // taken from a development template directory.
  const bool public_header = name.rfind("kdtree/", 0) == 0;
  if (const char* dir = std::getenv("KDTREE_TEMPLATE_DIR"); dir && *dir && !public_header) {
    std::string path = fmt::format("{}/{}", dir, name);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      fail(KDTREE_ERROR_INTERNAL,
           fmt::format("template '{}' not found at {} (KDTREE_TEMPLATE_DIR is set)", name, path));
    }
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  for (int i = 0; i < kEmbeddedTemplateCount; ++i) {
    if (name == kEmbeddedTemplates[i].name) return kEmbeddedTemplates[i].text;
  }
  fail(KDTREE_ERROR_INTERNAL, fmt::format("template '{}' is not embedded in this build", name));
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (int i = 0; i < kEmbeddedTemplateCount; ++i) {
    if (std::string(kEmbeddedTemplates[i].name).rfind("kdtree/", 0) != 0)
      names.emplace_back(kEmbeddedTemplates[i].name);
  }
  return names;
}

}  // namespace kdtree::codegen
