// tree_accept's generator: names, validation, and the rendered source, compiled
// with NVRTC for sm_90 and sm_120 (no GPU needed) with its per-node state in
// registers (no stack, no spills).
#include "codegen/tree_accept.hpp"

#include <doctest/doctest.h>

#include "tests/support/codegen_checks.hpp"

using kdtree::codegen::TreeAcceptSpec;

TEST_CASE("tree_accept spec: labels and keys") { kdtree::test::check_width_spec_names<TreeAcceptSpec>("tree_accept"); }

TEST_CASE("tree_accept spec: unsupported widths name the supported ones") {
  kdtree::test::check_unsupported_widths<TreeAcceptSpec>();
}

TEST_CASE("tree_accept source: specialised per width - compiles for sm_90 and sm_120") {
  kdtree::test::check_width_sources_compile<TreeAcceptSpec>("tree_accept", kdtree::codegen::generate_tree_accept, 4096);
}
