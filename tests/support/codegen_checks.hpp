// Checks shared by the generator tests (tests/codegen/*_test.cpp): a spec's
// validation error, and the W-specialised tree kernels (tree_build,
// tree_accept), whose specs have only max_tree_nodes and whose kernels must
// keep their per-node state in registers.
#pragma once
#include <string>

#include <doctest/doctest.h>

#include "base/error.hpp"
#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
#include "codegen/render.hpp"
#include "kdtree/kdtree.h"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/runtime.hpp"

namespace kdtree::test {

// The message of the kdtree::Error that validate(spec) throws ("" when it
// accepts the spec); *status gets the error's status (KDTREE_OK when accepted).
template <typename Spec>
std::string validation_error(const Spec& spec, kdtree_status* status) {
  try {
    validate(spec);
  } catch (const kdtree::Error& e) {
    *status = e.status();
    return e.what();
  }
  *status = KDTREE_OK;
  return "";
}

// Spec names for "op": label "op[W=64]", file stem "op-W64", a key per width.
template <typename Spec>
void check_width_spec_names(const std::string& op) {
  Spec spec;
  CHECK(spec.max_tree_nodes == 64);
  CHECK(spec.label() == op + "[W=64]");
  CHECK(spec.file_stem() == op + "-W64");
  spec.max_tree_nodes = 16;
  CHECK(spec.label() == op + "[W=16]");
  CHECK(spec.fast_key() != Spec{}.fast_key());
}

// Widths other than 16, 32, 64 and 128 are KDTREE_ERROR_UNSUPPORTED naming
// max_tree_nodes and the supported widths.
template <typename Spec>
void check_unsupported_widths() {
  for (int w : {0, 8, 48, 256}) {
    Spec spec;
    spec.max_tree_nodes = w;
    try {
      validate(spec);
      FAIL("W=" << w << " was accepted");
    } catch (const kdtree::Error& e) {
      CHECK(e.status() == KDTREE_ERROR_UNSUPPORTED);
      const std::string msg = e.what();
      CHECK(msg.find("max_tree_nodes") != std::string::npos);
      CHECK(msg.find("16, 32, 64 or 128") != std::string::npos);
    }
  }
}

// For every width on sm_90 and sm_120: `generate(spec, arch)` names the kernel
// after `op` (entry "kdtree_<op>"), bakes W in, includes nothing, and compiles
// with NVRTC with no stack, no spills and at most `max_static_smem` bytes of
// static shared memory.
template <typename Spec, typename Generate>
void check_width_sources_compile(const std::string& op, Generate generate, int max_static_smem) {
  const std::string entry = "kdtree_" + op;
  for (int sm : {90, 120}) {
    const codegen::Arch arch = codegen::arch_from_sm(sm);
    for (int w : {16, 32, 64, 128}) {
      Spec spec;
      spec.max_tree_nodes = w;
      INFO(op << "[W=" << w << "] sm_" << sm);
      codegen::KernelSource src = generate(spec, arch);
      CHECK(src.op == op);
      CHECK(src.label == spec.label());
      CHECK(src.file_stem == spec.file_stem());
      REQUIRE(src.entry_points.size() == 1);
      CHECK(src.entry_points[0] == entry);
      CHECK(codegen::flatten(src).find("#include \"") == std::string::npos);
      CHECK(src.source.find("#define KD_MAX_TREE_NODES " + std::to_string(w) + "\n") != std::string::npos);
      NvrtcOutput out = nvrtc_compile(src, arch);
      CHECK(!out.cubin.empty());
      auto usage = parse_ptxas_log(out.log);
      REQUIRE(usage.count(entry) == 1);
      INFO(out.log);
      CHECK(usage[entry].stack_bytes == 0);
      CHECK(usage[entry].spill_stores == 0);
      CHECK(usage[entry].static_smem <= max_static_smem);
    }
  }
}

}  // namespace kdtree::test
