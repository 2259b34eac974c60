// kdtree_gpu_tests --case: the point-name filter's matching (CPU only).
#include <doctest/doctest.h>

#include "kdtree/kdtree.h"
#include "reference/verify_case.hpp"
#include "tests/support/gpu_case_filter.hpp"

using kdtree::test::glob_match;

TEST_CASE("gpu --case: names match exactly or with '*' wildcards") {
  const kdtree_verify_spec mla{576, 512, 16, 1, 64, 64, KDTREE_DTYPE_BF16};
  const std::string name = kdtree::ref::verify_label(mla, 3);
  CHECK(name == "verify_attention[mla576/512,W=64,page=64,bf16,Hq=16,B=3]");
  CHECK(glob_match(name.c_str(), name.c_str()));
  CHECK(glob_match("verify_attention[mla576/512,W=64,*]", name.c_str()));
  CHECK(glob_match("*page=64*", name.c_str()));
  CHECK(glob_match("*", name.c_str()));
  CHECK_FALSE(glob_match("verify_attention[mla576/512,W=64,page=64,bf16,Hq=16,B=3", name.c_str()));
  CHECK_FALSE(glob_match("*W=32*", name.c_str()));
  const kdtree_verify_spec gqa{128, 128, 8, 2, 16, 32, KDTREE_DTYPE_F16};
  CHECK(kdtree::ref::verify_label(gqa, 1) == "verify_attention[gqa128,W=32,page=16,f16,Hq=8,Hkv=2,B=1]");
}
