#include "codegen/kv_compact.hpp"

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/tree_ops_common.hpp"
#include "codegen/verify_attention.hpp"

namespace kdtree::codegen {

std::string KvCompactSpec::label() const { return fmt::format("kv_compact[W={},page={}]", max_tree_nodes, page_size); }

std::string KvCompactSpec::fast_key() const { return fmt::format("kv_compact:W{}:p{}", max_tree_nodes, page_size); }

void validate(const KvCompactSpec& spec) {
  const int p = spec.page_size, w = spec.max_tree_nodes;
  if (!is_supported_page_size(p)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("kv_compact: page_size {} is not supported: use {}", p, supported_page_sizes_text()));
  }
  if (!is_supported_tree_width(w)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("kv_compact: max_tree_nodes {} is not supported: use 16, 32, 64 or 128", w));
  }
}

KernelSource generate_kv_compact(const KvCompactSpec& spec, const Arch& arch) {
  validate(spec);
  (void)arch;  // plain loads and stores: the same kernel for every supported arch
  Params params{
      {"PAGE_SIZE", std::to_string(spec.page_size)},
      {"MAX_TREE_NODES", std::to_string(spec.max_tree_nodes)},
      {"THREADS", std::to_string(kKvCompactThreads)},
      {"CHUNK_VECS", std::to_string(kKvCompactChunkVecs)},
      {"VECS_PER_THREAD", std::to_string(kKvCompactVecsPerThread)},
  };
  const std::string file_stem = fmt::format("kv_compact-W{}-p{}", spec.max_tree_nodes, spec.page_size);
  return tree_op_source("kv_compact", spec.label(), file_stem, params, kKvCompactThreads);
}

}  // namespace kdtree::codegen
