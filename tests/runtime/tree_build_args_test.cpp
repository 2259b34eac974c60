// kdtree_tree_build rejects bad arguments on the host, through the C ABI, before
// it needs a driver: these run on CPU-only machines. Pointers are fake (never
// dereferenced: every call here must fail validation).
#include <doctest/doctest.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kdtree/kdtree.h"

namespace {

// True when `field` occurs in `msg` as a whole word.
bool names(const std::string& msg, const std::string& field) {
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = msg.find(field); at != std::string::npos; at = msg.find(field, at + 1)) {
    const bool left = at == 0 || !word_char(msg[at - 1]);
    const bool right = at + field.size() == msg.size() || !word_char(msg[at + field.size()]);
    if (left && right) return true;
  }
  return false;
}

template <typename T>
T* fake(uintptr_t slot) {
  return reinterpret_cast<T*>(0x7f0000000000ull + slot * 0x100000ull);
}

struct Fixture {
  std::string dir;
  kdtree_runtime* rt = nullptr;
  Fixture() {
    char tmpl[] = "/tmp/kdtree-tree-build-args-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    REQUIRE(kdtree_runtime_create(0, dir.c_str(), &rt) == KDTREE_OK);
  }
  ~Fixture() {
    kdtree_runtime_destroy(rt);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;
};

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

// Runs the call; checks the status and that the message names `field`.
void expect_error(kdtree_runtime* rt, const kdtree_tree_build_args& a, kdtree_status status, const char* field) {
  INFO("expected an error naming " << field);
  CHECK(kdtree_tree_build(rt, &a) == status);
  const std::string msg = kdtree_last_error();
  INFO("message: " << msg);
  CHECK(names(msg, field));
  CHECK(names(msg, "kdtree_tree_build"));
}

}  // namespace

TEST_CASE("tree_build C ABI: NULL runtime and NULL args") {
  kdtree_tree_build_args a = good_args();
  CHECK(kdtree_tree_build(nullptr, &a) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "runtime"));
  Fixture f;
  CHECK(kdtree_tree_build(f.rt, nullptr) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "args"));
}

TEST_CASE("tree_build C ABI: unsupported max_tree_nodes names the supported widths") {
  Fixture f;
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
  Fixture f;
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
      {"budget", [](kdtree_tree_build_args& a) { a.max_tree_nodes = 16; a.budget = 16; }, "1..15"},
  };
  for (const Case& c : cases) {
    kdtree_tree_build_args a = good_args();
    c.breaks(a);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, c.field);
    CHECK(std::string(kdtree_last_error()).find(c.range) != std::string::npos);
  }
}

TEST_CASE("tree_build C ABI: every required pointer is checked for NULL and alignment") {
  Fixture f;
  struct Field {
    const char* name;
    void (*null)(kdtree_tree_build_args&);
    void (*misalign)(kdtree_tree_build_args&);
  };
#define KD_FIELD(F, T)                                                                 \
  Field {                                                                              \
    #F, [](kdtree_tree_build_args& a) { a.F = nullptr; },                              \
        [](kdtree_tree_build_args& a) { a.F = reinterpret_cast<T*>(fake<char>(40) + 2); } \
  }
  const Field fields[] = {
      KD_FIELD(draft_tokens, const int32_t), KD_FIELD(draft_logprobs, const float),
      KD_FIELD(root_tokens, const int32_t),  KD_FIELD(prefix_lens, const int32_t),
      KD_FIELD(tokens, int32_t),             KD_FIELD(parents, int32_t),
      KD_FIELD(depths, int32_t),             KD_FIELD(positions, int32_t),
      KD_FIELD(tree_mask, uint64_t),         KD_FIELD(first_child, int32_t),
      KD_FIELD(next_sibling, int32_t),       KD_FIELD(node_counts, int32_t),
  };
#undef KD_FIELD
  for (const Field& field : fields) {
    kdtree_tree_build_args a = good_args();
    field.null(a);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, field.name);
    CHECK(std::string(kdtree_last_error()).find("NULL") != std::string::npos);
    a = good_args();
    field.misalign(a);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, field.name);
    CHECK(std::string(kdtree_last_error()).find("aligned") != std::string::npos);
  }
  SUBCASE("scores is optional but must be aligned when given") {
    kdtree_tree_build_args a = good_args();
    a.scores = reinterpret_cast<float*>(fake<char>(41) + 1);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "scores");
  }
  SUBCASE("tree_mask needs 8-byte alignment") {
    kdtree_tree_build_args a = good_args();
    a.tree_mask = reinterpret_cast<uint64_t*>(fake<char>(42) + 4);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "tree_mask");
  }
}
