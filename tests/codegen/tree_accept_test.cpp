// tree_accept's generator: names, validation, and the rendered source, compiled
// with NVRTC for sm_90 and sm_120 (no GPU needed) with its per-node state in
// registers (no stack, no spills).
#include "codegen/tree_accept.hpp"

#include <doctest/doctest.h>

#include <string>

#include "runtime/error.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/runtime.hpp"

using kdtree::codegen::TreeAcceptSpec;

TEST_CASE("tree_accept spec: labels and keys") {
  TreeAcceptSpec spec;
  CHECK(spec.max_tree_nodes == 64);
  CHECK(spec.label() == "tree_accept[W=64]");
  CHECK(spec.file_stem() == "tree_accept-W64");
  spec.max_tree_nodes = 16;
  CHECK(spec.label() == "tree_accept[W=16]");
  CHECK(spec.fast_key() != TreeAcceptSpec{}.fast_key());
}

TEST_CASE("tree_accept spec: unsupported widths name the supported ones") {
  for (int w : {0, 8, 48, 256}) {
    TreeAcceptSpec spec;
    spec.max_tree_nodes = w;
    try {
      kdtree::codegen::validate(spec);
      FAIL("W=" << w << " was accepted");
    } catch (const kdtree::Error& e) {
      CHECK(e.status() == KDTREE_ERROR_UNSUPPORTED);
      const std::string msg = e.what();
      CHECK(msg.find("max_tree_nodes") != std::string::npos);
      CHECK(msg.find("16, 32, 64 or 128") != std::string::npos);
    }
  }
}

TEST_CASE("tree_accept source: specialised per width - compiles for sm_90 and sm_120") {
  for (int sm : {90, 120}) {
    const kdtree::codegen::Arch arch = kdtree::codegen::arch_from_sm(sm);
    for (int w : {16, 32, 64, 128}) {
      TreeAcceptSpec spec;
      spec.max_tree_nodes = w;
      INFO("tree_accept[W=" << w << "] sm_" << sm);
      kdtree::codegen::KernelSource src = kdtree::codegen::generate_tree_accept(spec, arch);
      CHECK(src.op == "tree_accept");
      CHECK(src.label == spec.label());
      CHECK(src.file_stem == spec.file_stem());
      REQUIRE(src.entry_points.size() == 1);
      CHECK(src.entry_points[0] == "kdtree_tree_accept");
      CHECK(src.source.find("#include") == std::string::npos);
      CHECK(src.source.find("constexpr int kW = " + std::to_string(w) + ";") != std::string::npos);
      kdtree::NvrtcOutput out = kdtree::nvrtc_compile(src, arch);
      CHECK(!out.cubin.empty());
      auto usage = kdtree::parse_ptxas_log(out.log);
      REQUIRE(usage.count("kdtree_tree_accept") == 1);
      INFO(out.log);
      CHECK(usage["kdtree_tree_accept"].stack_bytes == 0);
      CHECK(usage["kdtree_tree_accept"].spill_stores == 0);
      CHECK(usage["kdtree_tree_accept"].static_smem <= 4096);
    }
  }
}
