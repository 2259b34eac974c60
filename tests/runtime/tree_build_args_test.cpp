// kdtree_tree_build rejects bad arguments on the host, through the C ABI, before
// it needs a driver: these run on CPU-only machines. Pointers are fake (never
// dereferenced: every call here must fail validation).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "kdtree/kdtree.h"
#include "tests/support/c_api_fixture.hpp"

using namespace kdtree::test;

namespace {

const char* const kTempDir = "kdtree-tree-build-args";

kdtree_tree_build_args good_args() {
  kdtree_tree_build_args a{};
  a.batch_size = 4;
  a.depth = 8;
  a.top_k = 8;
  a.budget = 63;
  a.max_tree_nodes = 64;
  a.draft_tokens = fake<const int32_t>(1);
  a.draft_logprobs = fake<const float>(2);
  a.root_tokens = fake<const int32_t>(3);
  a.prefix_lens = fake<const int32_t>(4);
  a.tokens = fake<int32_t>(5);
  a.parents = fake<int32_t>(6);
  a.depths = fake<int32_t>(7);
  a.positions = fake<int32_t>(8);
  a.tree_mask = fake<uint64_t>(9);
  a.first_child = fake<int32_t>(10);
  a.next_sibling = fake<int32_t>(11);
  a.node_counts = fake<int32_t>(12);
  a.scores = nullptr;
  return a;
}

void expect_error(kdtree_runtime* rt, const kdtree_tree_build_args& a, kdtree_status status, const char* field) {
  kdtree::test::expect_error(kdtree_tree_build, "kdtree_tree_build", rt, a, status, field);
}

}  // namespace

TEST_CASE("tree_build C ABI: NULL runtime and NULL args") {
  Fixture f(kTempDir);
  expect_null_runtime_and_args_rejected(kdtree_tree_build, good_args(), f.rt);
}

TEST_CASE("tree_build C ABI: unsupported max_tree_nodes names the supported widths") {
  Fixture f(kTempDir);
  for (int w : {0, 8, 48, 96, 256}) {
    kdtree_tree_build_args a = good_args();
    a.max_tree_nodes = w;
    a.budget = 7;
    expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "max_tree_nodes");
    const std::string msg = kdtree_last_error();
    CHECK(msg.find("16, 32, 64") != std::string::npos);
  }
}

TEST_CASE("tree_build C ABI: out-of-range sizes name the argument and the range") {
  Fixture f(kTempDir);
  struct Case {
    const char* field;
    void (*breaks)(kdtree_tree_build_args&);
    const char* range;
  };
  const Case cases[] = {
      {"batch_size", [](kdtree_tree_build_args& a) { a.batch_size = 0; }, ">= 1"},
      {"batch_size", [](kdtree_tree_build_args& a) { a.batch_size = -3; }, ">= 1"},
      {"depth", [](kdtree_tree_build_args& a) { a.depth = 0; }, "1..16"},
      {"depth", [](kdtree_tree_build_args& a) { a.depth = 17; }, "1..16"},
      {"top_k", [](kdtree_tree_build_args& a) { a.top_k = 0; }, "1..64"},
      {"top_k", [](kdtree_tree_build_args& a) { a.top_k = 65; }, "1..64"},
      {"budget", [](kdtree_tree_build_args& a) { a.budget = 0; }, "1..63"},
      {"budget", [](kdtree_tree_build_args& a) { a.budget = 64; }, "1..63"},
      {"budget",
       [](kdtree_tree_build_args& a) {
         a.max_tree_nodes = 16;
         a.budget = 16;
       },
       "1..15"},
  };
  for (const Case& c : cases) {
    kdtree_tree_build_args a = good_args();
    c.breaks(a);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, c.field);
    CHECK(std::string(kdtree_last_error()).find(c.range) != std::string::npos);
  }
}

TEST_CASE("tree_build C ABI: every required pointer is checked for NULL and alignment") {
  Fixture f(kTempDir);
#define FIELD(F, T) KDTREE_TEST_POINTER_FIELD(kdtree_tree_build_args, F, T)
  expect_pointers_checked(kdtree_tree_build, "kdtree_tree_build", f.rt, good_args(),
                          {
                              FIELD(draft_tokens, const int32_t),
                              FIELD(draft_logprobs, const float),
                              FIELD(root_tokens, const int32_t),
                              FIELD(prefix_lens, const int32_t),
                              FIELD(tokens, int32_t),
                              FIELD(parents, int32_t),
                              FIELD(depths, int32_t),
                              FIELD(positions, int32_t),
                              FIELD(tree_mask, uint64_t),
                              FIELD(first_child, int32_t),
                              FIELD(next_sibling, int32_t),
                              FIELD(node_counts, int32_t),
                          });
#undef FIELD
  SUBCASE("scores is optional but must be aligned when given") {
    kdtree_tree_build_args a = good_args();
    a.scores = fake<float>(41, 1);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "scores");
  }
  SUBCASE("tree_mask needs 8-byte alignment") {
    kdtree_tree_build_args a = good_args();
    a.tree_mask = fake<uint64_t>(42, 4);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "tree_mask");
  }
}

TEST_CASE("tree_build C ABI: outputs that share memory are refused, naming both") {
  Fixture f(kTempDir);
  kdtree_tree_build_args a = good_args();
  a.parents = a.tokens;
  kdtree::test::expect_error(kdtree_tree_build, "kdtree_tree_build", f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "tokens");
  CHECK(names(kdtree_last_error(), "parents"));
  a = good_args();
  a.scores = reinterpret_cast<float*>(a.node_counts) - 2;  // its last 8 bytes on node_counts' first
  kdtree::test::expect_error(kdtree_tree_build, "kdtree_tree_build", f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "scores");
  CHECK(names(kdtree_last_error(), "node_counts"));
}
