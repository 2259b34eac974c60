// The C ABI: every extern "C" function of kdtree.h, in the header's order. Each
// checks its own pointers and hands the rest to the C++ side (runtime/<op>.cpp)
// through guarded(), which turns exceptions into a status and the message.
#include <string>

#include "codegen/shapes.hpp"
#include "runtime/c_api.hpp"
#include "runtime/tree_ops.hpp"
#include "runtime/verify_attention.hpp"

namespace kdtree {
namespace {
thread_local std::string t_last_error;
}
void set_last_error(const std::string& message) { t_last_error = message; }
}  // namespace kdtree

using kdtree::guarded;
using kdtree::require;
using kdtree::unwrap;

extern "C" {

const char* kdtree_version(void) { return KDTREE_VERSION_STRING; }

const char* kdtree_supported_shapes_json(void) {
  static const std::string json = kdtree::codegen::supported_shapes_json();  // built once, never fails
  return json.c_str();
}

const char* kdtree_last_error(void) { return kdtree::t_last_error.c_str(); }

kdtree_status kdtree_runtime_create(int device, const char* cache_dir_or_null, kdtree_runtime** out) {
  return guarded("kdtree_runtime_create", [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    auto rt = std::make_unique<kdtree_runtime>();
    rt->impl = std::make_unique<kdtree::Engine>(device, cache_dir_or_null ? cache_dir_or_null : "");
    *out = rt.release();
  });
}

kdtree_status kdtree_runtime_create_offline(int sm_arch, const char* cache_dir_or_null, kdtree_runtime** out) {
  return guarded("kdtree_runtime_create_offline", [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    auto rt = std::make_unique<kdtree_runtime>();
    rt->impl = kdtree::Engine::offline(sm_arch, cache_dir_or_null ? cache_dir_or_null : "");
    *out = rt.release();
  });
}

kdtree_status kdtree_runtime_destroy(kdtree_runtime* rt) {
  return guarded("kdtree_runtime_destroy", [&] { delete rt; });
}

kdtree_status kdtree_runtime_bind_context(kdtree_runtime* rt) {
  return guarded("kdtree_runtime_bind_context", [&] { unwrap(rt).make_current(); });
}

kdtree_status kdtree_runtime_arch(kdtree_runtime* rt, int* sm_arch) {
  return guarded("kdtree_runtime_arch", [&] {
    require(sm_arch != nullptr, "sm_arch is NULL");
    *sm_arch = unwrap(rt).arch().sm;
  });
}

kdtree_status kdtree_verify_workspace_size(kdtree_runtime* rt, const kdtree_verify_spec* spec, int batch_size,
                                           int total_nodes, int max_kv_len, size_t* bytes) {
  return guarded("kdtree_verify_workspace_size", [&] {
    require(spec != nullptr, "spec is NULL");
    require(bytes != nullptr, "bytes is NULL");
    *bytes = kdtree::verify_workspace_size(unwrap(rt), *spec, batch_size, total_nodes, max_kv_len);
  });
}

kdtree_status kdtree_verify_attention(kdtree_runtime* rt, const kdtree_verify_args* args) {
  return guarded("kdtree_verify_attention", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::verify_attention(unwrap(rt), *args);
  });
}

kdtree_status kdtree_warm(kdtree_runtime* rt, const kdtree_verify_spec* spec) {
  return guarded("kdtree_warm", [&] {
    require(spec != nullptr, "spec is NULL");
    kdtree::warm_verify(unwrap(rt), *spec);
  });
}

kdtree_status kdtree_tree_build(kdtree_runtime* rt, const kdtree_tree_build_args* args) {
  return guarded("kdtree_tree_build", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::tree_build(unwrap(rt), *args);
  });
}

kdtree_status kdtree_tree_accept(kdtree_runtime* rt, const kdtree_tree_accept_args* args) {
  return guarded("kdtree_tree_accept", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::tree_accept(unwrap(rt), *args);
  });
}

kdtree_status kdtree_tree_allocate(kdtree_runtime* rt, const kdtree_tree_allocate_args* args) {
  return guarded("kdtree_tree_allocate", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::tree_allocate(unwrap(rt), *args);
  });
}

kdtree_status kdtree_sample_tokens(kdtree_runtime* rt, const kdtree_sample_args* args) {
  return guarded("kdtree_sample_tokens", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::sample_tokens(unwrap(rt), *args);
  });
}

kdtree_status kdtree_kv_compact(kdtree_runtime* rt, const kdtree_kv_compact_args* args) {
  return guarded("kdtree_kv_compact", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::kv_compact(unwrap(rt), *args);
  });
}

}  // extern "C"
