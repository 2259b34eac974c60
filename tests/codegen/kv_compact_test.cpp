// kv_compact generator: names, validation and the rendered source. (NVRTC
// compiles it for sm_90 and sm_120 in tests/runtime/kernel_grid_compile_test.cpp.)
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "base/error.hpp"
#include "codegen/kv_compact.hpp"
#include "codegen/render.hpp"
#include "tests/support/codegen_checks.hpp"

using namespace kdtree::codegen;
using kdtree::test::validation_error;

TEST_CASE("kv_compact spec: names") {
  KvCompactSpec spec;
  spec.max_tree_nodes = 64;
  spec.page_size = 16;
  CHECK(spec.label() == "kv_compact[W=64,page=16]");
  const KernelSource s = generate_kv_compact(spec, arch_from_sm(120));
  CHECK(s.op == "kv_compact");
  CHECK(s.label == "kv_compact[W=64,page=16]");
  CHECK(s.file_stem == "kv_compact-W64-p16");
  // Every supported pair has its own key.
  std::set<std::string> keys, stems;
  for (int w : {16, 32, 64, 128}) {
    for (int p : {1, 16, 32, 64, 128}) {
      spec.max_tree_nodes = w;
      spec.page_size = p;
      CHECK(keys.insert(spec.fast_key()).second);
      CHECK(stems.insert(generate_kv_compact(spec, arch_from_sm(90)).file_stem).second);
    }
  }
}

TEST_CASE("kv_compact spec: unsupported page sizes and widths name the supported ones") {
  kdtree_status status = KDTREE_OK;
  KvCompactSpec spec;
  spec.page_size = 8;
  std::string msg = validation_error(spec, &status);
  CHECK(status == KDTREE_ERROR_UNSUPPORTED);
  CHECK(msg.find("page_size 8") != std::string::npos);
  CHECK(msg.find("1, 16, 32, 64 or 128") != std::string::npos);
  spec = KvCompactSpec{};
  spec.max_tree_nodes = 48;
  msg = validation_error(spec, &status);
  CHECK(status == KDTREE_ERROR_UNSUPPORTED);
  CHECK(msg.find("max_tree_nodes 48") != std::string::npos);
  CHECK(msg.find("16, 32, 64 or 128") != std::string::npos);
  CHECK_THROWS_AS(generate_kv_compact(spec, arch_from_sm(120)), kdtree::Error);
}

TEST_CASE("kv_compact source: self-contained - the spec baked in") {
  KvCompactSpec spec;
  spec.max_tree_nodes = 128;
  spec.page_size = 1;
  const KernelSource s = generate_kv_compact(spec, arch_from_sm(120));
  CHECK(s.entry_points == std::vector<std::string>{"kdtree_kv_compact"});
  const std::string flat = flatten(s);
  CHECK(flat.find("typedef struct kdtree_kv_compact_params") != std::string::npos);
  CHECK(flat.find("extern \"C\" __global__") != std::string::npos);
  CHECK(flat.find("#include \"") == std::string::npos);
  CHECK(s.source.find("#define KD_PAGE_SIZE 1\n") != std::string::npos);
  CHECK(s.source.find("#define KD_MAX_TREE_NODES 128\n") != std::string::npos);
}
