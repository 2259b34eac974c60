// codegen/shapes: the one table of supported shapes, its JSON export, and that
// validation refuses exactly what the table leaves out.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "base/error.hpp"
#include "codegen/shapes.hpp"
#include "codegen/verify_attention.hpp"
#include "kdtree/kdtree.h"

using namespace kdtree::codegen;

TEST_CASE("shapes: the table's values and texts") {
  CHECK(supported_widths() == std::vector<int>{16, 32, 64, 128});
  CHECK(supported_page_sizes() == std::vector<int>{1, 16, 32, 64, 128});
  CHECK(supported_page_sizes_text() == "1, 16, 32, 64 or 128");
  CHECK(supported_widths_text() == "16, 32, 64 or 128");
  CHECK(head_names_text() == "mla576/512, gqa64, gqa128 or gqa256");
  REQUIRE(find_head(576, 512) != nullptr);
  CHECK(find_head(576, 512)->mla);
  CHECK(find_head(128, 128) != nullptr);
  CHECK(find_head(96, 96) == nullptr);
  CHECK(find_head(512, 576) == nullptr);
}

TEST_CASE("shapes: validate_verify_spec accepts every table point and refuses its neighbours") {
  for (const HeadShape& h : supported_heads()) {
    for (int w : supported_widths()) {
      for (int p : supported_page_sizes()) {
        for (kdtree_dtype d : supported_attention_dtypes()) {
          const kdtree_verify_spec s{h.head_dim_qk, h.head_dim_v, 8, h.mla ? 1 : 2, p, w, d};
          CHECK_NOTHROW(validate_verify_spec(s));
        }
      }
    }
  }
  const kdtree_verify_spec good{576, 512, 8, 1, 64, 64, KDTREE_DTYPE_BF16};
  for (int w : {8, 48, 256}) {
    kdtree_verify_spec s = good;
    s.max_tree_nodes = w;
    CHECK_THROWS_WITH_AS(validate_verify_spec(s), doctest::Contains("16, 32, 64 or 128"), kdtree::Error);
  }
  kdtree_verify_spec s = good;
  s.page_size = 8;
  CHECK_THROWS_WITH_AS(validate_verify_spec(s), doctest::Contains("1, 16, 32, 64 or 128"), kdtree::Error);
}

TEST_CASE("shapes: kdtree_supported_shapes_json is the table") {
  const std::string json = kdtree_supported_shapes_json();
  CHECK(json == supported_shapes_json());
  CHECK(json.front() == '{');
  CHECK(json.back() == '}');
  CHECK(json.find(R"("widths":[16,32,64,128])") != std::string::npos);
  CHECK(json.find(R"("page_sizes":[1,16,32,64,128])") != std::string::npos);
  CHECK(json.find(R"("dtypes":["bf16","f16"])") != std::string::npos);
  CHECK(json.find(R"({"name":"mla576/512","head_dim_qk":576,"head_dim_v":512,"mla":true})") != std::string::npos);
  CHECK(json.find(R"("sm_120")") != std::string::npos);
  CHECK(json.find(R"("kv_dtypes":["as_q","e4m3"],"archs")") != std::string::npos);
  const std::string grid_kv = R"("kv_dtypes":["as_q","e4m3"])";  // the default grid compiles both
  CHECK(json.find(R"("default_grid":{"heads":["mla576/512","gqa64","gqa128","gqa256"],"widths":[16,32,64,128],)"
                  R"("page_sizes":[1,16,64],"dtypes":["bf16","f16"],)" +
                  grid_kv + "}") != std::string::npos);
}

TEST_CASE("shapes: KV dtypes - the list, names and parsing") {
  CHECK(supported_kv_dtypes() == std::vector<kdtree_kv_dtype>{KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3});
  CHECK(parse_kv_dtype("as_q") == KDTREE_KV_DTYPE_AS_Q);
  CHECK(parse_kv_dtype("e4m3") == KDTREE_KV_DTYPE_E4M3);
  CHECK_THROWS_WITH_AS(parse_kv_dtype("fp8"), doctest::Contains("as_q or e4m3"), kdtree::Error);
  CHECK_THROWS_WITH_AS(parse_kv_dtype(""), doctest::Contains("as_q or e4m3"), kdtree::Error);
  // Every table point validates with either KV dtype.
  for (kdtree_kv_dtype kv : supported_kv_dtypes()) {
    const kdtree_verify_spec s{576, 512, 8, 1, 64, 64, KDTREE_DTYPE_BF16, kv};
    CHECK(validate_verify_spec(s).kv_dtype == kv);
  }
  kdtree_verify_spec bad{576, 512, 8, 1, 64, 64, KDTREE_DTYPE_BF16, KDTREE_KV_DTYPE_AS_Q};
  const int32_t seven = 7;
  std::memcpy(&bad.kv_dtype, &seven, sizeof seven);  // not through the enum: 7 is outside its range
  CHECK_THROWS_WITH_AS(validate_verify_spec(bad), doctest::Contains("kv_dtype 7"), kdtree::Error);
}
