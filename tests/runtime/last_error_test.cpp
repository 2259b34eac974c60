// kdtree_last_error() keeps the message of the last *failed* call on the thread
// (kdtree.h): successful calls in between do not clear it, and other threads
// never see it.
#include <doctest/doctest.h>

#include <string>
#include <thread>

#include "kdtree/kdtree.h"
#include "tests/support/temp_dir.hpp"

TEST_CASE("last_error: a successful call keeps the last failed call's message") {
  kdtree::test::TempDir dir("kdtree-last-error");
  int sm = 0;
  REQUIRE(kdtree_runtime_arch(nullptr, &sm) == KDTREE_ERROR_INVALID_ARGUMENT);
  const std::string failed = kdtree_last_error();
  CHECK(failed.find("kdtree_runtime_arch") != std::string::npos);
  CHECK(failed.find("runtime is NULL") != std::string::npos);

  // Successful calls of several kinds (create, query, destroy) leave it as it was.
  kdtree_runtime* rt = nullptr;
  REQUIRE(kdtree_runtime_create_offline(90, dir.path.c_str(), &rt) == KDTREE_OK);
  CHECK(std::string(kdtree_last_error()) == failed);
  REQUIRE(kdtree_runtime_arch(rt, &sm) == KDTREE_OK);
  CHECK(sm == 90);
  CHECK(std::string(kdtree_last_error()) == failed);
  REQUIRE(kdtree_runtime_destroy(rt) == KDTREE_OK);
  CHECK(std::string(kdtree_last_error()) == failed);

  // The next failure replaces it.
  REQUIRE(kdtree_runtime_create_offline(90, dir.path.c_str(), nullptr) == KDTREE_ERROR_INVALID_ARGUMENT);
  const std::string second = kdtree_last_error();
  CHECK(second != failed);
  CHECK(second.find("kdtree_runtime_create_offline") != std::string::npos);
}

TEST_CASE("last_error: thread-local - a fresh thread sees \"\" and another thread's failure stays there") {
  REQUIRE(kdtree_runtime_arch(nullptr, nullptr) != KDTREE_OK);
  const std::string here = kdtree_last_error();
  std::string fresh = "unset", after = "unset";
  std::thread t([&] {
    fresh = kdtree_last_error();
    kdtree_runtime_destroy(nullptr);  // deleting NULL succeeds
    after = kdtree_last_error();
  });
  t.join();
  CHECK(fresh.empty());
  CHECK(after.empty());
  CHECK(std::string(kdtree_last_error()) == here);
}
