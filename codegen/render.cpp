#include "codegen/render.hpp"

#include <algorithm>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/template_store.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {
namespace {

bool is_name_char(char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

// Names NAME of the "#ifndef KD_NAME" lines of a config header.
std::set<std::string> config_names(std::string_view config_name, std::string_view config) {
  std::set<std::string> names;
  std::istringstream in{std::string(config)};
  const std::string marker = "#ifndef KD_";
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.rfind(marker, 0) != 0) continue;
    const std::string name = line.substr(marker.size());
    bool ok = !name.empty();
    for (char c : name) ok = ok && is_name_char(c);
    if (!ok || !names.insert(name).second) {
      fail(KDTREE_ERROR_INTERNAL, fmt::format("template {}:{}: '{}' is not one new KD_<NAME> default "
                                              "([A-Z0-9_]+, once)",
                                              config_name, line_no, line));
    }
  }
  return names;
}

}  // namespace

std::string config_prelude(std::string_view config_name, std::string_view config, const Params& params) {
  const std::set<std::string> defaults = config_names(config_name, config);
  std::string out;
  for (const auto& [name, value] : params) {
    if (!defaults.count(name)) {
      fail(KDTREE_ERROR_INTERNAL,
           fmt::format("template {}: the generator sets KD_{}, which the header does not declare", config_name, name));
    }
    out += fmt::format("#define KD_{} {}\n", name, value);
  }
  for (const std::string& name : defaults) {
    if (!params.count(name)) {
      fail(KDTREE_ERROR_INTERNAL,
           fmt::format("template {}: KD_{} has no value from the generator (its default is for tools only)",
                       config_name, name));
    }
  }
  return out;
}

void set_template_source(KernelSource& ks, const std::string& name, const Params& params,
                         const std::vector<std::string>& headers) {
  const std::string config_name = name + "_config.h";
  const std::string config = template_text(config_name);
  ks.source = config_prelude(config_name, config, params) + template_text(name + ".cu");
  ks.headers = {{"common.cuh", template_text("common.cuh")},
                {"kdtree/kdtree_device_errors.h", template_text("kdtree/kdtree_device_errors.h")}};
  for (const std::string& h : headers.empty() ? std::vector<std::string>{name + "_params.h"} : headers) {
    ks.headers.emplace_back(h, template_text(h));
  }
  ks.headers.emplace_back(config_name, config);
}

namespace {

void expand(const std::string& text, const KernelSource& ks, std::set<std::string>& done, std::string& out) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto header = std::find_if(ks.headers.begin(), ks.headers.end(),
                                     [&](const auto& h) { return line == "#include \"" + h.first + "\""; });
    if (header == ks.headers.end()) {
      out += line + "\n";
    } else if (done.insert(header->first).second) {
      expand(header->second, ks, done, out);
    }
  }
}

}  // namespace

std::string flatten(const KernelSource& ks) {
  std::string out;
  std::set<std::string> done;
  expand(ks.source, ks, done, out);
  return out;
}

}  // namespace kdtree::codegen
