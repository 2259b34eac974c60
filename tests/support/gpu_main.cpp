// Main of kdtree_gpu_tests. Without a usable GPU it runs nothing and exits 77,
// which CTest reports as "Skipped" (SKIP_RETURN_CODE), never as passed.
// --case NAME (or --case=NAME) runs the grid points named NAME ('*' wildcards,
// tests/support/gpu_case_filter.hpp) of the grid test cases only; a NAME that
// matches no point fails the run. doctest's own options (-tc=...) still apply.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/driver.hpp"
#include "tests/support/gpu_case_filter.hpp"

int main(int argc, char** argv) {
  bool listing = false, test_case_filter = false;
  // Take --case out of argv before doctest sees it.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
      kdtree::test::case_filter() = argv[++i];
    } else if (std::strncmp(argv[i], "--case=", 7) == 0) {
      kdtree::test::case_filter() = argv[i] + 7;
    } else if (std::strcmp(argv[i], "--case") == 0) {
      std::fprintf(stderr,
                   "kdtree_gpu_tests: --case needs a grid point name, e.g. "
                   "--case 'verify_attention[mla576/512,W=64,page=64,bf16,Hq=16,B=3]'\n");
      return 2;
    } else {
      test_case_filter |= std::strncmp(argv[i], "-tc", 3) == 0 || std::strncmp(argv[i], "--test-case", 11) == 0;
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-ltc", 4) == 0 ||
        std::strcmp(argv[i], "--help") == 0) {
      listing = true;
    }
  }
  std::string why;
  if (!listing && !kdtree::driver::available(&why)) {
    std::printf("SKIPPED: GPU tests not run: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  const std::string& filter = kdtree::test::case_filter();
  // A point filter runs the grid test cases, whose points it names.
  if (!filter.empty() && !test_case_filter) context.addFilter("test-case", "*parity*");
  const int status = context.run();
  if (!filter.empty() && !listing && kdtree::test::cases_selected() == 0) {
    std::printf("kdtree_gpu_tests: no grid point matches --case '%s' (names as the parity tests print them)\n",
                filter.c_str());
    return status ? status : 1;
  }
  return status;
}
