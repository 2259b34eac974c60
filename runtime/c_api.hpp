// Glue between the C ABI and the C++ internals: every extern "C" entry point
// runs its body through guarded(), which turns exceptions into a status and the
// thread-local last-error message.
#pragma once
#include <exception>
#include <memory>
#include <string>

#include "base/error.hpp"
#include "kdtree/kdtree.h"
#include "runtime/runtime.hpp"

struct kdtree_runtime {
  std::unique_ptr<kdtree::Engine> impl;
};

namespace kdtree {

void set_last_error(const std::string& message);

template <typename Body>
kdtree_status guarded(const char* function, Body&& body) noexcept {
  try {
    // A successful call leaves the message alone: kdtree.h promises the last *failed* call's message.
    body();
    return KDTREE_OK;
  } catch (const Error& e) {
    set_last_error(std::string(function) + ": " + e.what());
    return e.status();
  } catch (const std::exception& e) {
    set_last_error(std::string(function) + ": internal error: " + e.what());
    return KDTREE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(std::string(function) + ": internal error");
    return KDTREE_ERROR_INTERNAL;
  }
}

inline Engine& unwrap(kdtree_runtime* rt) {
  require(rt != nullptr && rt->impl != nullptr, "runtime is NULL");
  return *rt->impl;
}

}  // namespace kdtree
