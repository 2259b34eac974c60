#include "codegen/render.hpp"

#include <set>

#include <fmt/format.h>

#include "base/error.hpp"

namespace kdtree::codegen {
namespace {

bool is_key_start(char c) { return (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_key_char(char c) { return is_key_start(c) || (c >= '0' && c <= '9'); }

}  // namespace

std::string render(std::string_view template_name, std::string_view text, const Params& params) {
  std::string out;
  out.reserve(text.size() + 256);
  std::set<std::string> used;
  int line = 1;
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c == '\n') ++line;
    if (c != '$' || i + 1 >= text.size() || text[i + 1] != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t close = text.find('}', i + 2);
    std::string_view key = close == std::string_view::npos ? std::string_view{}
                                                            : text.substr(i + 2, close - i - 2);
    bool well_formed = !key.empty() && is_key_start(key[0]);
    for (char k : key) well_formed = well_formed && is_key_char(k);
    if (!well_formed) {
      fail(KDTREE_ERROR_INTERNAL,
           fmt::format("template {}:{}: malformed placeholder near '{}' (expected ${{NAME}} with NAME "
                       "in [A-Z_][A-Z0-9_]*)",
                       template_name, line, text.substr(i, std::min<size_t>(24, text.size() - i))));
    }
    auto it = params.find(std::string(key));
    if (it == params.end()) {
      fail(KDTREE_ERROR_INTERNAL,
           fmt::format("template {}:{}: placeholder ${{{}}} has no value", template_name, line, key));
    }
    used.insert(it->first);
    out += it->second;
    i = close + 1;
  }
  for (const auto& [key, value] : params) {
    if (!used.count(key)) {
      fail(KDTREE_ERROR_INTERNAL,
           fmt::format("template {}: value for '{}' is not used by the template", template_name, key));
    }
  }
  return out;
}

}  // namespace kdtree::codegen
