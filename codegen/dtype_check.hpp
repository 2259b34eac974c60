// kdtree_dtype fields come from C callers (and ctypes) as raw integers. Reading a
// value outside the enum's range through the enum type is undefined behaviour in
// C++ (UBSan: -fsanitize=enum), so every entry point reads the field's bytes as an
// int32 first and refuses anything that is not a kdtree_dtype enumerator.
#pragma once
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "base/error.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

static_assert(sizeof(kdtree_dtype) == sizeof(int32_t), "kdtree_dtype is an int-sized C enum");

// The integer a caller stored in a kdtree_dtype field, without loading it as the enum.
inline int32_t raw_dtype(const kdtree_dtype& field) {
  int32_t raw;
  std::memcpy(&raw, &field, sizeof raw);
  return raw;
}

// `field` as a kdtree_dtype; throws KDTREE_ERROR_INVALID_ARGUMENT naming `name`
// when it holds another integer (whether the op supports the dtype is its own check).
inline kdtree_dtype checked_dtype(const kdtree_dtype& field, const char* name) {
  const int32_t raw = raw_dtype(field);
  if (raw != KDTREE_DTYPE_BF16 && raw != KDTREE_DTYPE_F16 && raw != KDTREE_DTYPE_F32) {
    fail(
        KDTREE_ERROR_INVALID_ARGUMENT,
        fmt::format("{} = {} is not a kdtree_dtype (KDTREE_DTYPE_BF16 = 0, KDTREE_DTYPE_F16 = 1, KDTREE_DTYPE_F32 = 2)",
                    name, raw));
  }
  return static_cast<kdtree_dtype>(raw);
}

static_assert(sizeof(kdtree_kv_dtype) == sizeof(int32_t), "kdtree_kv_dtype is an int-sized C enum");

// The same for a kdtree_kv_dtype field (its enum's range is only 0..1).
inline kdtree_kv_dtype checked_kv_dtype(const kdtree_kv_dtype& field, const char* name) {
  int32_t raw;
  std::memcpy(&raw, &field, sizeof raw);
  if (raw != KDTREE_KV_DTYPE_AS_Q && raw != KDTREE_KV_DTYPE_E4M3) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         fmt::format("{} {} is not a kdtree_kv_dtype (KDTREE_KV_DTYPE_AS_Q = 0: the caches hold dtype, "
                     "KDTREE_KV_DTYPE_E4M3 = 1)",
                     name, raw));
  }
  return static_cast<kdtree_kv_dtype>(raw);
}

}  // namespace kdtree::codegen
