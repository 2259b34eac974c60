#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.hpp"
#include "runtime/driver.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/runtime.hpp"

using namespace kdtree;

TEST_CASE("a compile error carries the NVRTC log - the options and the source file") {
  codegen::KernelSource src;
  src.op = "broken";
  src.label = "broken[test]";
  src.file_stem = "broken-test";
  src.source = "extern \"C\" __global__ void k() { this_is_not_declared = 1; }\n";
  try {
    nvrtc_compile(src, codegen::arch_from_sm(120));
    FAIL("expected a compile error");
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK(e.status() == KDTREE_ERROR_COMPILE);
    CHECK(msg.find("this_is_not_declared") != std::string::npos);       // the log
    CHECK(msg.find("--gpu-architecture=sm_120") != std::string::npos);  // the options
    auto at = msg.find("source: ");
    REQUIRE(at != std::string::npos);
    std::string path = msg.substr(at + 8, msg.find('\n', at) - at - 8);
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text == src.source);
    std::filesystem::remove(path);
  }
}

TEST_CASE("ptxas resource reports are parsed per kernel") {
  std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'kdtree_a' for 'sm_90'\n"
      "ptxas info    : Function properties for kdtree_a\n"
      "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'kdtree_b' for 'sm_90'\n"
      "ptxas info    : Function properties for kdtree_b\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 32 registers, used 0 barriers, 400 bytes cmem[0]\n";
  auto usage = parse_ptxas_log(log);
  REQUIRE(usage.size() == 2);
  CHECK(usage["kdtree_a"].registers == 168);
  CHECK(usage["kdtree_a"].static_smem == 2048);
  CHECK(usage["kdtree_a"].spill_stores == 4);
  CHECK(usage["kdtree_a"].spill_loads == 12);
  CHECK(usage["kdtree_b"].registers == 32);
  CHECK(usage["kdtree_b"].static_smem == 0);
}

TEST_CASE("the driver is loaded only at first device use") {
  // Creating a runtime and compiling need no driver.
  auto dir = std::filesystem::temp_directory_path() / "kdtree-nodriver-test";
  Engine rt(0, dir.string());
  CHECK(rt.has_device());
  std::string why;
  if (!driver::available(&why)) {
    MESSAGE("no GPU here: " << why);
    try {
      rt.make_current();
      FAIL("expected an error without a driver");
    } catch (const Error& e) {
      CHECK((e.status() == KDTREE_ERROR_NO_DRIVER || e.status() == KDTREE_ERROR_NO_DEVICE ||
             e.status() == KDTREE_ERROR_DRIVER));
      CHECK(std::string(e.what()).size() > 10);
    }
  }
  std::filesystem::remove_all(dir);
}
