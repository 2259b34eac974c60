// Engine::compile: one compile per key in a process, however many threads ask,
// and a second runtime on the same directory reuses the disk entry.
#include <doctest/doctest.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "codegen/verify_attention.hpp"
#include "runtime/runtime.hpp"

using namespace kdtree;

TEST_CASE("threads asking for one kernel compile it once") {
  auto dir = std::filesystem::temp_directory_path() / "kdtree-runtime-compile-test";
  std::filesystem::remove_all(dir);
  codegen::VerifySpec spec;
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.max_tree_nodes = 16;
  {
    auto rt = Engine::offline(120, dir.string());
    codegen::KernelSource src = codegen::generate_verify_attention(spec, rt->arch());
    std::vector<std::shared_ptr<const CompiledModule>> results(6);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i) threads.emplace_back([&, i] { results[i] = rt->compile(src); });
    for (auto& t : threads) t.join();
    int built = 0;
    for (const auto& m : results) {
      REQUIRE(m);
      CHECK(m->cubin == results[0]->cubin);
      built += m->outcome == cache::Outcome::built;
    }
    CHECK(built == 1);
    CHECK(results[0]->usage.count("kdtree_verify_attention") == 1);
    CHECK(results[0]->usage.count("kdtree_verify_combine") == 1);
  }
  auto again = Engine::offline(120, dir.string());
  auto m = again->compile(codegen::generate_verify_attention(spec, again->arch()));
  CHECK(m->outcome == cache::Outcome::disk_hit);
  // The resource report travels with the cached cubin.
  CHECK(m->usage.at("kdtree_verify_attention").registers > 0);
  std::filesystem::remove_all(dir);
}
