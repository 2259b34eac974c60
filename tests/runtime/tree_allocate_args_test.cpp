// kdtree_tree_allocate rejects bad arguments on the host, through the C ABI,
// before it needs a driver: these run on CPU-only machines. Pointers are fake
// (never dereferenced: every call here must fail validation). The scores' order is
// device data, checked by the kernel (see tests/ops/tree_allocate_gpu.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kdtree/kdtree.h"
#include "tests/support/c_api_fixture.hpp"

using namespace kdtree::test;

namespace {

const char* const kTempDir = "kdtree-tree-allocate-args";

kdtree_tree_allocate_args good_args() {
  kdtree_tree_allocate_args a{};
  a.batch_size = 4;
  a.max_tree_nodes = 32;
  a.cap = 31;
  a.total = 24;
  a.scores = fake<const float>(1);
  a.active = fake<const uint8_t>(2);
  a.remaining = fake<const int32_t>(3);
  a.urgency = 8.0f;
  a.node_counts = fake<int32_t>(4);
  a.node_indptr = fake<int32_t>(5);
  a.row_req = fake<int64_t>(6);
  a.row_node = fake<int64_t>(7);
  a.error_flags = nullptr;
  return a;
}

void expect_error(kdtree_runtime* rt, const kdtree_tree_allocate_args& a, kdtree_status status, const char* field) {
  kdtree::test::expect_error(kdtree_tree_allocate, "kdtree_tree_allocate", rt, a, status, field);
}

}  // namespace

TEST_CASE("tree_allocate C ABI: NULL runtime and NULL args") {
  Fixture f(kTempDir);
  expect_null_runtime_and_args_rejected(kdtree_tree_allocate, good_args(), f.rt);
}

TEST_CASE("tree_allocate C ABI: unsupported max_tree_nodes, bad batch_size, cap, total and urgency") {
  Fixture f(kTempDir);
  for (int w : {0, 1, 24, 512}) {
    kdtree_tree_allocate_args a = good_args();
    a.max_tree_nodes = w;
    expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "max_tree_nodes");
  }
  for (int b : {0, -1, 2049}) {
    kdtree_tree_allocate_args a = good_args();
    a.batch_size = b;
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "batch_size");
  }
  for (int cap : {0, -1, 32}) {
    INFO("tree_allocate[W=32,B=4] cap " << cap);
    kdtree_tree_allocate_args a = good_args();
    a.cap = cap;
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "cap");
  }
  for (int total : {-1, 4 * 31 + 1}) {
    INFO("tree_allocate[W=32,B=4] total " << total);
    kdtree_tree_allocate_args a = good_args();
    a.total = total;
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "total");
  }
  for (float u : {-1.0f, NAN, INFINITY}) {
    kdtree_tree_allocate_args a = good_args();
    a.urgency = u;
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "urgency");
  }
}

TEST_CASE("tree_allocate C ABI: every required pointer is checked for NULL and alignment") {
  Fixture f(kTempDir);
#define FIELD(F, T) KDTREE_TEST_POINTER_FIELD(kdtree_tree_allocate_args, F, T)
  expect_pointers_checked(kdtree_tree_allocate, "kdtree_tree_allocate", f.rt, good_args(),
                          {
                              FIELD(scores, const float),
                              FIELD(node_counts, int32_t),
                              FIELD(node_indptr, int32_t),
                              FIELD(row_req, int64_t),
                              FIELD(row_node, int64_t),
                          });
#undef FIELD
  SUBCASE("optional remaining and error_flags must be aligned when given") {
    kdtree_tree_allocate_args a = good_args();
    a.remaining = fake<const int32_t>(41, 1);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "remaining");
    a = good_args();
    a.error_flags = fake<int32_t>(42, 3);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "error_flags");
  }
}

TEST_CASE("tree_allocate C ABI: outputs that share memory are refused, naming both") {
  Fixture f(kTempDir);
  kdtree_tree_allocate_args a = good_args();
  a.row_node = a.row_req;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_req");
  CHECK(names(kdtree_last_error(), "row_node"));
}
