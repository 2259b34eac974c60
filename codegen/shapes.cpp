#include "codegen/shapes.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/arch.hpp"
#include "codegen/grid.hpp"
#include "codegen/verify_attention.hpp"

namespace kdtree::codegen {
namespace {

bool contains(const std::vector<int>& values, int v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

std::string json_ints(const std::vector<int>& values) { return fmt::format("[{}]", fmt::join(values, ",")); }

std::string json_strings(const std::vector<std::string>& values) {
  std::vector<std::string> quoted;
  for (const std::string& v : values) quoted.push_back(fmt::format("\"{}\"", v));  // names need no escaping
  return fmt::format("[{}]", fmt::join(quoted, ","));
}

std::vector<std::string> dtype_names(const std::vector<kdtree_dtype>& dtypes) {
  std::vector<std::string> names;
  for (kdtree_dtype d : dtypes) names.push_back(dtype_name(d));
  return names;
}

std::vector<std::string> kv_dtype_names(const std::vector<kdtree_kv_dtype>& kv_dtypes) {
  std::vector<std::string> names;
  for (kdtree_kv_dtype d : kv_dtypes) names.push_back(kv_dtype_name(d));
  return names;
}

}  // namespace

const std::vector<HeadShape>& supported_heads() {
  static const std::vector<HeadShape> heads{{"mla576/512", 576, 512, true},
                                            {"gqa64", 64, 64, false},
                                            {"gqa128", 128, 128, false},
                                            {"gqa256", 256, 256, false}};
  return heads;
}

const HeadShape* find_head(int head_dim_qk, int head_dim_v) {
  for (const HeadShape& h : supported_heads()) {
    if (h.head_dim_qk == head_dim_qk && h.head_dim_v == head_dim_v) return &h;
  }
  return nullptr;
}

const std::vector<int>& supported_widths() {
  static const std::vector<int> widths{16, 32, 64, 128};
  return widths;
}

bool is_supported_tree_width(int max_tree_nodes) { return contains(supported_widths(), max_tree_nodes); }

const std::vector<int>& supported_page_sizes() {
  static const std::vector<int> sizes{1, 16, 32, 64, 128};
  return sizes;
}

bool is_supported_page_size(int page_size) { return contains(supported_page_sizes(), page_size); }

const std::vector<kdtree_dtype>& supported_attention_dtypes() {
  static const std::vector<kdtree_dtype> dtypes{KDTREE_DTYPE_BF16, KDTREE_DTYPE_F16};
  return dtypes;
}

const std::vector<kdtree_kv_dtype>& supported_kv_dtypes() {
  static const std::vector<kdtree_kv_dtype> kv_dtypes{KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3};
  return kv_dtypes;
}

kdtree_kv_dtype parse_kv_dtype(const std::string& name) {
  for (kdtree_kv_dtype d : supported_kv_dtypes()) {
    if (name == kv_dtype_name(d)) return d;
  }
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("kv dtype '{}' is not supported (use {})", name,
                                             fmt::join(kv_dtype_names(supported_kv_dtypes()), " or ")));
}

std::string or_list(const std::vector<int>& values) {
  std::string text;
  for (std::size_t i = 0; i < values.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + std::to_string(values[i]);
  }
  return text;
}

std::string supported_page_sizes_text() { return or_list(supported_page_sizes()); }
std::string supported_widths_text() { return or_list(supported_widths()); }

std::string head_names_text() {
  std::string text;
  const std::vector<HeadShape>& heads = supported_heads();
  for (std::size_t i = 0; i < heads.size(); ++i) {
    text += std::string(i == 0 ? "" : i + 1 == heads.size() ? " or " : ", ") + heads[i].name;
  }
  return text;
}

std::string supported_shapes_json() {
  std::vector<std::string> heads;
  for (const HeadShape& h : supported_heads()) {
    heads.push_back(fmt::format(R"({{"name":"{}","head_dim_qk":{},"head_dim_v":{},"mla":{}}})", h.name, h.head_dim_qk,
                                h.head_dim_v, h.mla ? "true" : "false"));
  }
  std::vector<std::string> archs;
  for (int sm : supported_sms()) archs.push_back(fmt::format("sm_{}", sm));
  const GridOptions grid;
  return fmt::format(R"({{"heads":[{}],"widths":{},"page_sizes":{},"dtypes":{},"kv_dtypes":{},"archs":{},)"
                     R"("default_grid":{{"heads":{},"widths":{},"page_sizes":{},"dtypes":{},"kv_dtypes":{}}}}})",
                     fmt::join(heads, ","), json_ints(supported_widths()), json_ints(supported_page_sizes()),
                     json_strings(dtype_names(supported_attention_dtypes())),
                     json_strings(kv_dtype_names(supported_kv_dtypes())), json_strings(archs), json_strings(grid.heads),
                     json_ints(grid.widths), json_ints(grid.page_sizes), json_strings(dtype_names(grid.dtypes)),
                     json_strings(kv_dtype_names(grid.kv_dtypes)));
}

}  // namespace kdtree::codegen
