#include "codegen/tree_allocate.hpp"

#include <fmt/format.h>

#include "codegen/tree_ops_common.hpp"

namespace kdtree::codegen {

std::string TreeAllocateSpec::label() const { return fmt::format("tree_allocate[W={}]", max_tree_nodes); }

std::string TreeAllocateSpec::file_stem() const { return fmt::format("tree_allocate-W{}", max_tree_nodes); }

std::string TreeAllocateSpec::fast_key() const { return file_stem(); }

void validate(const TreeAllocateSpec& spec) { validate_tree_width("tree_allocate", spec.max_tree_nodes); }

KernelSource generate_tree_allocate(const TreeAllocateSpec& spec, const Arch& arch) {
  validate(spec);
  (void)arch;  // 1024 threads and 33 KB of static shared memory fit every sm_80+ part
  Params params{
      {"MAX_TREE_NODES", std::to_string(spec.max_tree_nodes)},
      {"THREADS", std::to_string(kTreeAllocateThreads)},
      {"MAX_BATCH", std::to_string(kTreeAllocateMaxBatch)},
  };
  return tree_op_source("tree_allocate", spec.label(), spec.file_stem(), params, kTreeAllocateThreads);
}

}  // namespace kdtree::codegen
