// The one table of what kdtree generates: head shapes, tree widths, page sizes,
// dtypes and arches. Validation, messages, kdtree-gen's flags and grid, the C
// function kdtree_supported_shapes_json(), and through it the Python package and
// the DDTree example all read it; nothing else lists these values.
#pragma once
#include <string>
#include <vector>

#include "kdtree/kdtree.h"

namespace kdtree::codegen {

// One attention head shape: MLA's absorbed 576/512 (one latent KV head; V is the
// first 512 dims of the K row) or GQA/MHA with equal K and V head dims.
struct HeadShape {
  const char* name;  // "mla576/512", "gqa64", ...; what head_name() prints
  int head_dim_qk;
  int head_dim_v;
  bool mla;
};

// mla576/512, gqa64, gqa128, gqa256.
const std::vector<HeadShape>& supported_heads();
// The head with these dims, or nullptr.
const HeadShape* find_head(int head_dim_qk, int head_dim_v);

// Tree widths W (max_tree_nodes), ascending: 16, 32, 64, 128.
const std::vector<int>& supported_widths();
bool is_supported_tree_width(int max_tree_nodes);

// KV tokens per page for verify_attention and kv_compact, ascending: 1, 16, 32, 64, 128.
const std::vector<int>& supported_page_sizes();
bool is_supported_page_size(int page_size);

// Element types of q/caches/out for verify_attention and kv_compact: bf16, f16.
const std::vector<kdtree_dtype>& supported_attention_dtypes();

// Element types of verify_attention's KV caches (kdtree_verify_spec.kv_dtype) and
// of kv_compact's rows: as_q (the 16-bit dtype of q), e4m3.
const std::vector<kdtree_kv_dtype>& supported_kv_dtypes();
// "as_q" or "e4m3"; throws KDTREE_ERROR_UNSUPPORTED listing the names otherwise.
kdtree_kv_dtype parse_kv_dtype(const std::string& name);

// "1, 16, 32, 64 or 128"
std::string or_list(const std::vector<int>& values);
std::string supported_page_sizes_text();  // or_list(supported_page_sizes())
std::string supported_widths_text();      // or_list(supported_widths())
// "mla576/512, gqa64, gqa128 or gqa256"
std::string head_names_text();

// The whole table as one JSON object:
// {"heads":[{"name":"mla576/512","head_dim_qk":576,"head_dim_v":512,"mla":true},...],
//  "widths":[16,...],"page_sizes":[1,...],"dtypes":["bf16","f16"],"kv_dtypes":["as_q","e4m3"],
//  "archs":["sm_80",...],
//  "default_grid":{"heads":[...],"widths":[...],"page_sizes":[...],"dtypes":[...],"kv_dtypes":[...]}}
std::string supported_shapes_json();

}  // namespace kdtree::codegen
