// Helpers for the C ABI argument tests (tests/runtime/*_args_test.cpp): a device
// runtime that is never bound (creation needs no driver), fake device pointers
// and a whole-word check on kdtree_last_error() messages.
#pragma once
#include <cctype>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include <doctest/doctest.h>

#include "kdtree/kdtree.h"
#include "tests/support/temp_dir.hpp"

namespace kdtree::test {

// True when `field` occurs in `msg` as a whole word (so "q" does not match "num_q_heads").
inline bool names(const std::string& msg, const std::string& field) {
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = msg.find(field); at != std::string::npos; at = msg.find(field, at + 1)) {
    const bool left = at == 0 || !word_char(msg[at - 1]);
    const bool right = at + field.size() == msg.size() || !word_char(msg[at + field.size()]);
    if (left && right) return true;
  }
  return false;
}

// A device pointer that is never dereferenced: each slot its own 1 MB-aligned
// address, `misalign` bytes past it.
template <typename T>
T* fake(uintptr_t slot, uintptr_t misalign = 0) {
  return reinterpret_cast<T*>(0x7f0000000000ull + slot * 0x100000ull + misalign);
}

// Stores `value` in a kdtree_dtype field as a C caller would, without making an
// out-of-range enum value in C++ (that would itself be undefined behaviour).
inline void set_raw_dtype(kdtree_dtype& field, int32_t value) {
  static_assert(sizeof field == sizeof value, "kdtree_dtype is int-sized");
  std::memcpy(&field, &value, sizeof value);
}

inline void set_raw_kv_dtype(kdtree_kv_dtype& field, int32_t value) {
  static_assert(sizeof field == sizeof value, "kdtree_kv_dtype is int-sized");
  std::memcpy(&field, &value, sizeof value);
}

// Integers that are not kdtree_dtype enumerators; 1000 and -1 lie outside the
// enum's range (loading them as the enum is UB), 3 inside it.
constexpr int32_t kBadDtypes[] = {3, 7, 1000, -1};

// A device runtime with its own cache directory (/tmp/<name>-XXXXXX).
struct Fixture {
  TempDir dir;
  kdtree_runtime* rt = nullptr;
  explicit Fixture(const std::string& name) : dir(name) {
    REQUIRE(kdtree_runtime_create(0, dir.path.c_str(), &rt) == KDTREE_OK);
  }
  ~Fixture() { kdtree_runtime_destroy(rt); }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;
};

// An op's C entry point, e.g. kdtree_tree_build.
template <typename Args>
using Entry = kdtree_status (*)(kdtree_runtime*, const Args*);

// Runs `entry` on `a`; checks the status and that the message names `field`
// and the entry point (`entry_name`).
template <typename Args>
void expect_error(Entry<Args> entry, const char* entry_name, kdtree_runtime* rt, const Args& a, kdtree_status status,
                  const char* field) {
  INFO("expected an error naming " << field);
  CHECK(entry(rt, &a) == status);
  const std::string msg = kdtree_last_error();
  INFO("message: " << msg);
  CHECK(names(msg, field));
  CHECK(names(msg, entry_name));
}

// A NULL runtime and NULL args are rejected, naming "runtime" and "args".
template <typename Args>
void expect_null_runtime_and_args_rejected(Entry<Args> entry, const Args& good, kdtree_runtime* rt) {
  CHECK(entry(nullptr, &good) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "runtime"));
  CHECK(entry(rt, nullptr) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "args"));
}

// A required pointer argument: how to make it NULL and how to misalign it.
template <typename Args>
struct PointerField {
  const char* name;
  void (*null)(Args&);
  void (*misalign)(Args&);
};

// PointerField for member F of type T* of ARGS (misaligned by 2 bytes).
#define KDTREE_TEST_POINTER_FIELD(ARGS, F, T)                                                 \
  kdtree::test::PointerField<ARGS> {                                                          \
#F, [](ARGS & a) { a.F = nullptr; }, [](ARGS & a) { a.F = kdtree::test::fake<T>(40, 2); } \
  }

// Each field of `good`, made NULL and then misaligned, is rejected naming the
// field and saying "NULL" / "aligned".
template <typename Args>
void expect_pointers_checked(Entry<Args> entry, const char* entry_name, kdtree_runtime* rt, const Args& good,
                             std::initializer_list<PointerField<Args>> fields) {
  for (const PointerField<Args>& field : fields) {
    Args a = good;
    field.null(a);
    expect_error(entry, entry_name, rt, a, KDTREE_ERROR_INVALID_ARGUMENT, field.name);
    CHECK(std::string(kdtree_last_error()).find("NULL") != std::string::npos);
    a = good;
    field.misalign(a);
    expect_error(entry, entry_name, rt, a, KDTREE_ERROR_INVALID_ARGUMENT, field.name);
    CHECK(std::string(kdtree_last_error()).find("aligned") != std::string::npos);
  }
}

}  // namespace kdtree::test
