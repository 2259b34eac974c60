// The supported arches are a closed list: an unknown one (sm_999, sm_85) is
// refused up front, naming the list, by the library (arch_from_sm, parse_arch,
// kdtree_runtime_create_offline) and so by kdtree-gen, which goes through them.
#include <doctest/doctest.h>

#include <string>

#include "base/error.hpp"
#include "codegen/arch.hpp"
#include "kdtree/kdtree.h"
#include "tests/support/temp_dir.hpp"

using namespace kdtree::codegen;

namespace {

const char* const kList = "sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_110, sm_120, sm_121";

// Runs `f`, which must throw UNSUPPORTED naming `arch` and the supported list.
template <typename F>
void expect_unsupported(F&& f, const std::string& arch) {
  try {
    f();
    FAIL("accepted " << arch);
  } catch (const kdtree::Error& e) {
    CHECK(e.status() == KDTREE_ERROR_UNSUPPORTED);
    CHECK(std::string(e.what()).find(arch) != std::string::npos);
    CHECK(std::string(e.what()).find(kList) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("arch: every supported arch has limits - sm_120 keeps the 99 KB budget") {
  CHECK(supported_arch_list() == kList);
  for (int sm : supported_sms()) {
    INFO("sm_" << sm);
    const Arch a = arch_from_sm(sm);
    CHECK(a.sm == sm);
    CHECK(a.max_smem_per_block >= 99 * 1024);
    CHECK(a.max_smem_per_sm >= a.max_smem_per_block);
    CHECK(parse_arch("sm_" + std::to_string(sm)).sm == sm);
    CHECK(parse_arch(std::to_string(sm)).sm == sm);
  }
  CHECK(arch_from_sm(120).max_smem_per_block == 99 * 1024);
  CHECK(arch_from_sm(90).max_smem_per_block == 227 * 1024);
}

TEST_CASE("arch: unknown arches are refused with the supported list") {
  for (int sm : {0, 75, 85, 91, 130, 999, -90}) {
    INFO("sm_" << sm);
    expect_unsupported([&] { arch_from_sm(sm); }, "sm_" + std::to_string(sm));
  }
  expect_unsupported([] { parse_arch("sm_999"); }, "sm_999");
  expect_unsupported([] { parse_arch("999"); }, "sm_999");
  expect_unsupported([] { parse_arch("hopper"); }, "'hopper'");
  expect_unsupported([] { parse_arch("sm_90a"); }, "'sm_90a'");
}

TEST_CASE("arch: kdtree_runtime_create_offline refuses an unknown arch") {
  kdtree::test::TempDir dir("kdtree-arch");
  for (int sm : {1000, 999, 75}) {
    INFO("sm_" << sm);
    kdtree_runtime* rt = reinterpret_cast<kdtree_runtime*>(&dir);  // must be reset to NULL
    CHECK(kdtree_runtime_create_offline(sm, dir.path.c_str(), &rt) == KDTREE_ERROR_UNSUPPORTED);
    CHECK(rt == nullptr);
    const std::string msg = kdtree_last_error();
    CHECK(msg.find("sm_" + std::to_string(sm)) != std::string::npos);
    CHECK(msg.find(kList) != std::string::npos);
  }
  kdtree_runtime* rt = nullptr;
  REQUIRE(kdtree_runtime_create_offline(120, dir.path.c_str(), &rt) == KDTREE_OK);
  kdtree_runtime_destroy(rt);
}
