// kdtree_tree_accept rejects bad arguments on the host, through the C ABI, before
// it needs a driver: these run on CPU-only machines. Pointers are fake (never
// dereferenced: every call here must fail validation). Tree shape and node
// counts are device data, checked by the kernel (see tests/ops/tree_accept_gpu.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "kdtree/kdtree.h"
#include "tests/support/c_api_fixture.hpp"

using namespace kdtree::test;

namespace {

const char* const kTempDir = "kdtree-tree-accept-args";

kdtree_tree_accept_args good_args() {
  kdtree_tree_accept_args a{};
  a.batch_size = 4;
  a.max_tree_nodes = 32;
  a.tokens = fake<const int32_t>(1);
  a.parents = fake<const int32_t>(2);
  a.node_counts = fake<const int32_t>(3);
  a.target_tokens = fake<const int32_t>(4);
  a.node_indptr = nullptr;
  a.accepted_path = fake<int32_t>(5);
  a.accept_lens = fake<int32_t>(6);
  a.bonus_tokens = fake<int32_t>(7);
  a.error_flags = nullptr;
  return a;
}

void expect_error(kdtree_runtime* rt, const kdtree_tree_accept_args& a, kdtree_status status, const char* field) {
  kdtree::test::expect_error(kdtree_tree_accept, "kdtree_tree_accept", rt, a, status, field);
}

}  // namespace

TEST_CASE("tree_accept C ABI: NULL runtime and NULL args") {
  Fixture f(kTempDir);
  expect_null_runtime_and_args_rejected(kdtree_tree_accept, good_args(), f.rt);
}

TEST_CASE("tree_accept C ABI: unsupported max_tree_nodes and bad batch_size") {
  Fixture f(kTempDir);
  for (int w : {0, 1, 24, 100, 512}) {
    kdtree_tree_accept_args a = good_args();
    a.max_tree_nodes = w;
    expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "max_tree_nodes");
    CHECK(std::string(kdtree_last_error()).find("16, 32, 64") != std::string::npos);
  }
  for (int b : {0, -1}) {
    kdtree_tree_accept_args a = good_args();
    a.batch_size = b;
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "batch_size");
  }
}

TEST_CASE("tree_accept C ABI: every required pointer is checked for NULL and alignment") {
  Fixture f(kTempDir);
#define FIELD(F, T) KDTREE_TEST_POINTER_FIELD(kdtree_tree_accept_args, F, T)
  expect_pointers_checked(kdtree_tree_accept, "kdtree_tree_accept", f.rt, good_args(),
                          {
                              FIELD(tokens, const int32_t),
                              FIELD(parents, const int32_t),
                              FIELD(node_counts, const int32_t),
                              FIELD(target_tokens, const int32_t),
                              FIELD(accepted_path, int32_t),
                              FIELD(accept_lens, int32_t),
                              FIELD(bonus_tokens, int32_t),
                          });
#undef FIELD
  SUBCASE("optional node_indptr and error_flags must be aligned when given") {
    kdtree_tree_accept_args a = good_args();
    a.node_indptr = fake<const int32_t>(41, 1);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "node_indptr");
    a = good_args();
    a.error_flags = fake<int32_t>(42, 3);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "error_flags");
  }
}

TEST_CASE("tree_accept C ABI: packed targets need total_nodes in batch_size..batch_size * max_tree_nodes") {
  // Without it the kernel cannot bound its reads of target_tokens[node_indptr[b] + i].
  Fixture f(kTempDir);
  for (int total : {0, -1, 3, 4 * 32 + 1}) {
    INFO("tree_accept[W=32,B=4] packed, total_nodes " << total);
    kdtree_tree_accept_args a = good_args();
    a.node_indptr = fake<const int32_t>(8);
    a.total_nodes = total;
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "total_nodes");
    CHECK(std::string(kdtree_last_error()).find("node_indptr[batch_size]") != std::string::npos);
  }
}

TEST_CASE("tree_accept C ABI: outputs that share memory are refused, naming both") {
  Fixture f(kTempDir);
  kdtree_tree_accept_args a = good_args();
  a.bonus_tokens = a.accept_lens;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "accept_lens");
  CHECK(names(kdtree_last_error(), "bonus_tokens"));
}
