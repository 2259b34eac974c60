// kdtree_tree_accept rejects bad arguments on the host, through the C ABI, before
// it needs a driver: these run on CPU-only machines. Pointers are fake (never
// dereferenced: every call here must fail validation). Tree shape and node
// counts are device data, checked by the kernel (see tests/ops/tree_accept_gpu.cpp).
#include <doctest/doctest.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kdtree/kdtree.h"

namespace {

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
    char tmpl[] = "/tmp/kdtree-tree-accept-args-XXXXXX";
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
  INFO("expected an error naming " << field);
  CHECK(kdtree_tree_accept(rt, &a) == status);
  const std::string msg = kdtree_last_error();
  INFO("message: " << msg);
  CHECK(names(msg, field));
  CHECK(names(msg, "kdtree_tree_accept"));
}

}  // namespace

TEST_CASE("tree_accept C ABI: NULL runtime and NULL args") {
  kdtree_tree_accept_args a = good_args();
  CHECK(kdtree_tree_accept(nullptr, &a) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "runtime"));
  Fixture f;
  CHECK(kdtree_tree_accept(f.rt, nullptr) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "args"));
}

TEST_CASE("tree_accept C ABI: unsupported max_tree_nodes and bad batch_size") {
  Fixture f;
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
  Fixture f;
  struct Field {
    const char* name;
    void (*null)(kdtree_tree_accept_args&);
    void (*misalign)(kdtree_tree_accept_args&);
  };
#define KD_FIELD(F, T)                                                                  \
  Field {                                                                               \
    #F, [](kdtree_tree_accept_args& a) { a.F = nullptr; },                              \
        [](kdtree_tree_accept_args& a) { a.F = reinterpret_cast<T*>(fake<char>(40) + 2); } \
  }
  const Field fields[] = {
      KD_FIELD(tokens, const int32_t),        KD_FIELD(parents, const int32_t),
      KD_FIELD(node_counts, const int32_t),   KD_FIELD(target_tokens, const int32_t),
      KD_FIELD(accepted_path, int32_t),       KD_FIELD(accept_lens, int32_t),
      KD_FIELD(bonus_tokens, int32_t),
  };
#undef KD_FIELD
  for (const Field& field : fields) {
    kdtree_tree_accept_args a = good_args();
    field.null(a);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, field.name);
    CHECK(std::string(kdtree_last_error()).find("NULL") != std::string::npos);
    a = good_args();
    field.misalign(a);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, field.name);
  }
  SUBCASE("optional node_indptr and error_flags must be aligned when given") {
    kdtree_tree_accept_args a = good_args();
    a.node_indptr = reinterpret_cast<const int32_t*>(fake<char>(41) + 1);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "node_indptr");
    a = good_args();
    a.error_flags = reinterpret_cast<int32_t*>(fake<char>(42) + 3);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "error_flags");
  }
}
