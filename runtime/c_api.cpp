// The runtime-level entry points of the C ABI (the operations live beside their
// kernels: runtime/verify_attention.cpp, runtime/tree_build.cpp, ...).
#include <string>

#include "runtime/c_api.hpp"

namespace kdtree {
namespace {
thread_local std::string t_last_error;
}
void set_last_error(const std::string& message) { t_last_error = message; }
}  // namespace kdtree

using kdtree::guarded;
using kdtree::require;

extern "C" {

const char* kdtree_version(void) { return KDTREE_VERSION_STRING; }

const char* kdtree_last_error(void) { return kdtree::t_last_error.c_str(); }

kdtree_status kdtree_runtime_create(int device, const char* cache_dir_or_null, kdtree_runtime** out) {
  return guarded("kdtree_runtime_create", [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    auto rt = std::make_unique<kdtree_runtime>();
    rt->impl = std::make_unique<kdtree::Runtime>(device, cache_dir_or_null ? cache_dir_or_null : "");
    *out = rt.release();
  });
}

kdtree_status kdtree_runtime_create_offline(int sm_arch, const char* cache_dir_or_null, kdtree_runtime** out) {
  return guarded("kdtree_runtime_create_offline", [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    auto rt = std::make_unique<kdtree_runtime>();
    rt->impl = kdtree::Runtime::offline(sm_arch, cache_dir_or_null ? cache_dir_or_null : "");
    *out = rt.release();
  });
}

kdtree_status kdtree_runtime_destroy(kdtree_runtime* rt) {
  return guarded("kdtree_runtime_destroy", [&] { delete rt; });
}

kdtree_status kdtree_runtime_bind_context(kdtree_runtime* rt) {
  return guarded("kdtree_runtime_bind_context", [&] { kdtree::unwrap(rt).make_current(); });
}

kdtree_status kdtree_runtime_arch(kdtree_runtime* rt, int* sm_arch) {
  return guarded("kdtree_runtime_arch", [&] {
    require(sm_arch != nullptr, "sm_arch is NULL");
    *sm_arch = kdtree::unwrap(rt).arch().sm;
  });
}

}  // extern "C"
