// Template rendering: `${NAME}` placeholders (NAME = [A-Z_][A-Z0-9_]*) replaced
// by values. An unknown placeholder (no value) or an unused value is an error, so
// a template and its generator cannot drift apart silently.
#pragma once
#include <map>
#include <string>
#include <string_view>

namespace kdtree::codegen {

using Params = std::map<std::string, std::string>;

// `template_name` only labels error messages. Throws kdtree::Error
// (KDTREE_ERROR_INTERNAL) naming the template, key and line.
std::string render(std::string_view template_name, std::string_view text, const Params& params);

}  // namespace kdtree::codegen
