// Host checks on the device pointers an operation is given, before any device
// use: the message names the argument (KDTREE_ERROR_INVALID_ARGUMENT).
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/error.hpp"

namespace kdtree {

// `p` must be non-NULL and `alignment`-byte aligned.
inline void require_buffer(const void* p, size_t alignment, const char* name) {
  require(p != nullptr, "{} is NULL", name);
  require(reinterpret_cast<uintptr_t>(p) % alignment == 0, "{} must be {}-byte aligned", name, alignment);
}

// An optional pointer: NULL, or `alignment`-byte aligned.
inline void require_optional_buffer(const void* p, size_t alignment, const char* name) {
  if (p) require_buffer(p, alignment, name);
}

}  // namespace kdtree
