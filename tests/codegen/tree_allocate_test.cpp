// tree_allocate's generator: names, validation, and the rendered source, compiled
// with NVRTC for sm_90 and sm_120 (no GPU needed): no stack, no spills, and its
// per-request state within the static shared memory the spec promises (33 KB for
// 2048 requests).
#include "codegen/tree_allocate.hpp"

#include <doctest/doctest.h>

#include "tests/support/codegen_checks.hpp"

using kdtree::codegen::TreeAllocateSpec;

TEST_CASE("tree_allocate spec: labels and keys") {
  kdtree::test::check_width_spec_names<TreeAllocateSpec>("tree_allocate");
}

TEST_CASE("tree_allocate spec: unsupported widths name the supported ones") {
  kdtree::test::check_unsupported_widths<TreeAllocateSpec>();
}

TEST_CASE("tree_allocate source: specialised per width - compiles for sm_90 and sm_120") {
  kdtree::test::check_width_sources_compile<TreeAllocateSpec>("tree_allocate", kdtree::codegen::generate_tree_allocate,
                                                              34 * 1024);
}
