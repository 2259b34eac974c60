// tree_build's generator: names, validation, and the rendered source, compiled
// with NVRTC for sm_90 and sm_120 (no GPU needed) with the frontier kept in
// registers (no local-memory stack, no spills).
#include "codegen/tree_build.hpp"

#include <doctest/doctest.h>

#include "tests/support/codegen_checks.hpp"

using kdtree::codegen::TreeBuildSpec;

TEST_CASE("tree_build spec: labels and keys") { kdtree::test::check_width_spec_names<TreeBuildSpec>("tree_build"); }

TEST_CASE("tree_build spec: unsupported widths name the supported ones") {
  kdtree::test::check_unsupported_widths<TreeBuildSpec>();
}

TEST_CASE("tree_build source: specialised per width - compiles for sm_90 and sm_120") {
  kdtree::test::check_width_sources_compile<TreeBuildSpec>("tree_build", kdtree::codegen::generate_tree_build, 8192);
}
