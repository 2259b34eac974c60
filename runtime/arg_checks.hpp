// Host checks on the device pointers an operation is given, before any device
// use: the message names the argument (KDTREE_ERROR_INVALID_ARGUMENT).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

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

// A buffer an operation writes: its address, its bytes (as the call's sizes give them), its name.
struct OutputBuffer {
  const void* p;
  size_t bytes;
  const char* name;
};

// The outputs of one call must not share memory: a kernel writing two of them into one buffer
// leaves neither right. NULL (an absent optional output) overlaps nothing.
inline void require_disjoint(std::initializer_list<OutputBuffer> outs) {
  for (auto i = outs.begin(); i != outs.end(); ++i) {
    for (auto j = i + 1; j != outs.end(); ++j) {
      if (!i->p || !j->p) continue;
      const uintptr_t a = reinterpret_cast<uintptr_t>(i->p), b = reinterpret_cast<uintptr_t>(j->p);
      require(a + i->bytes <= b || b + j->bytes <= a, "{} and {} share memory; every output needs a buffer of its own",
              i->name, j->name);
    }
  }
}

}  // namespace kdtree
