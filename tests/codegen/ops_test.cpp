// The operation registry: every operation the warm grid compiles is one that
// kdtree-gen emit can print, under the same name, and an unknown name is an
// error that lists the known ones.
#include "codegen/ops.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>

#include "base/error.hpp"

using namespace kdtree::codegen;

TEST_CASE("ops: the grid's operations and emit's are the same list") {
  const Arch arch = arch_from_sm(120);
  std::set<std::string> names, in_grid;
  for (const OpInfo& op : operations()) {
    INFO(op.name);
    CHECK(names.insert(op.name).second);
    CHECK(&find_operation(op.name) == &op);
    // The default point generates a kernel of this op.
    OpPoint point;
    if (std::string(op.name) == "sample_tokens") point.dtype = KDTREE_DTYPE_F32;
    const KernelSource source = op.generate(point, arch);
    CHECK(source.op == op.name);
    CHECK(source.label.rfind(std::string(op.name) + "[", 0) == 0);
  }
  for (const GridItem& item : enumerate_grid(GridOptions{}, arch))
    in_grid.insert(item.label.substr(0, item.label.find('[')));
  CHECK(in_grid == names);
  CHECK(operation_names().size() == names.size());
}

TEST_CASE("ops: an unknown operation names the known ones") {
  try {
    find_operation("tree_prune");
    FAIL("find_operation accepted tree_prune");
  } catch (const kdtree::Error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(e.status() == KDTREE_ERROR_UNSUPPORTED);
    CHECK(message.find("tree_prune") != std::string::npos);
    for (const std::string& name : operation_names()) CHECK(message.find(name) != std::string::npos);
  }
}

TEST_CASE("ops: a point outside an operation's values is rejected by that operation") {
  const Arch arch = arch_from_sm(90);
  OpPoint point;
  point.width = 48;
  CHECK_THROWS_AS(find_operation("tree_build").generate(point, arch), kdtree::Error);
  point = OpPoint{};
  point.page = 8;
  CHECK_THROWS_AS(find_operation("kv_compact").generate(point, arch), kdtree::Error);
  point = OpPoint{};
  point.head = "gqa96";
  CHECK_THROWS_AS(find_operation("verify_attention").generate(point, arch), kdtree::Error);
  point = OpPoint{};
  point.dtype = KDTREE_DTYPE_F16;  // sampling takes bf16 or f32 logits
  CHECK_THROWS_AS(find_operation("sample_tokens").generate(point, arch), kdtree::Error);
}
