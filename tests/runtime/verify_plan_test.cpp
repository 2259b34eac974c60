// The verify_attention split planner (runtime/verify_attention.cpp plan_verify):
// uniform splits or stream-K for kernels that run it, the KDTREE_VERIFY_SCHEDULE
// override, and the workspace each plan needs. Host only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/error.hpp"
#include "codegen/verify_attention.hpp"
#include "runtime/verify_attention.hpp"
#include "tests/support/env_var.hpp"

using namespace kdtree;

namespace {

kdtree_verify_spec mla(int heads, int width) {
  return kdtree_verify_spec{576, 512, heads, 1, 64, width, KDTREE_DTYPE_BF16};
}

// The plan for `batch` requests of `nodes` nodes each after a prefix, with the
// kernel generated for sm_<sm> (its default tiles).
VerifyPlan plan(int sm, const kdtree_verify_spec& s, int batch, int nodes, int prefix, int forced = 0) {
  const codegen::Arch arch = codegen::arch_from_sm(sm);
  const codegen::KernelSource src = codegen::generate_verify_attention(codegen::validate_verify_spec(s), arch);
  return plan_verify(src.launch, arch, s, batch, batch * nodes, prefix + nodes, forced);
}

// KDTREE_VERIFY_SCHEDULE for one scope.
struct ScopedSchedule : test::EnvVar {
  explicit ScopedSchedule(const char* v) : EnvVar("KDTREE_VERIFY_SCHEDULE", v) {}
};

}  // namespace

TEST_CASE("verify_plan[mla576/512,sm_120]: stream-K where waves would be partial, uniform splits for one request") {
  const ScopedSchedule unset("");  // the cost model's own choice
  // 8 requests x 32 nodes x 16 heads: 64 row tiles of 258 KV tiles on 188 SMs.
  const VerifyPlan b8 = plan(120, mla(16, 32), 8, 32, 4096);
  CHECK(b8.stream_ctas == 188);
  CHECK(b8.num_splits == 1);
  CHECK(b8.grid_x == 188);
  CHECK(b8.grid_y == 1);
  CHECK(b8.grid_z == 1);
  CHECK(b8.combine_grid_x > 0);
  CHECK(b8.workspace_bytes == size_t(2) * 188 * 64 * (512 * 2 + 4) + size_t(188) * 64);
  // One request of 16 nodes: 4 row tiles, split evenly without the segments' cost.
  const VerifyPlan b1 = plan(120, mla(16, 16), 1, 16, 4096);
  CHECK(b1.stream_ctas == 0);
  CHECK(b1.num_splits > 1);
  CHECK(b1.grid_z == unsigned(b1.num_splits));
  CHECK(b1.workspace_bytes == verify_workspace_bytes(mla(16, 16), 16, b1.num_splits));
  // A forced split count is uniform splits.
  const VerifyPlan forced = plan(120, mla(16, 32), 8, 32, 4096, 3);
  CHECK(forced.stream_ctas == 0);
  CHECK(forced.num_splits == 3);
}

TEST_CASE("verify_plan[mla576/512,sm_90]: the overlapped combine requests shared memory for its even share per SM") {
  const ScopedSchedule unset("");
  const codegen::Arch h200 = codegen::arch_from_sm(90);
  // B=1 H=16 n=16 4K: 256 one-row combine CTAs on 132 SMs, at most 2 per SM.
  const VerifyPlan small = plan(90, mla(16, 16), 1, 16, 4096);
  REQUIRE(small.combine_grid_x * small.combine_grid_y == 256);
  CHECK(small.combine_dynamic_smem == unsigned(h200.max_smem_per_sm / 2 - 1024));
  CHECK(small.combine_dynamic_smem <= unsigned(h200.max_smem_per_block));
  // B=64 H=8 n=8 4K with its two splits' partials (automatically they merge in a cluster):
  // 4096 CTAs, 32 per SM (the CTA limit): a few KB.
  const VerifyPlan large = [] {
    const ScopedSchedule splits("splits");
    return plan(90, mla(8, 16), 64, 8, 4096);
  }();
  REQUIRE(large.combine_grid_x * large.combine_grid_y == 4096);
  CHECK(large.combine_dynamic_smem == unsigned(h200.max_smem_per_sm / 32 - 1024));
  // No combine (one split), or an arch without programmatic launch: none.
  CHECK(plan(90, mla(16, 16), 1, 16, 4096, 1).combine_dynamic_smem == 0);
  CHECK(plan(80, mla(16, 16), 1, 16, 4096).combine_dynamic_smem == 0);
}

TEST_CASE("verify_plan: KDTREE_VERIFY_SCHEDULE forces stream-K or uniform splits, and is checked") {
  {
    ScopedSchedule s("stream");
    CHECK(plan(120, mla(16, 16), 1, 16, 4096).stream_ctas == 188);
    // Never more CTAs than units: one row tile of one KV tile.
    const VerifyPlan tiny = plan(120, mla(16, 16), 1, 1, 0);
    CHECK(tiny.stream_ctas == 1);
    CHECK(tiny.workspace_bytes == 0);
    CHECK(tiny.combine_grid_x == 0);
    CHECK(plan(120, mla(16, 32), 8, 32, 4096, 2).num_splits == 2);  // a forced count still wins
    CHECK(plan(90, mla(16, 32), 8, 32, 4096).stream_ctas == 132);   // sm_90's wgmma kernel runs it
    {
      const test::EnvVar tiles("KDTREE_VERIFY_TILES", "kernel=flash,warp_rows=32");  // the flash kernel does not
      CHECK(plan(90, mla(16, 32), 8, 32, 4096).stream_ctas == 0);
    }
  }
  {
    ScopedSchedule s("splits");
    const VerifyPlan b8 = plan(120, mla(16, 32), 8, 32, 4096);
    CHECK(b8.stream_ctas == 0);
    CHECK(b8.num_splits >= 1);
  }
  {
    ScopedSchedule s("streamk");
    try {
      plan(120, mla(16, 32), 8, 32, 4096);
      FAIL("an unknown schedule was accepted");
    } catch (const Error& e) {
      CHECK(e.status() == KDTREE_ERROR_INVALID_ARGUMENT);
      CHECK(std::string(e.what()).find("KDTREE_VERIFY_SCHEDULE='streamk'") != std::string::npos);
    }
  }
}

TEST_CASE("verify_plan[mla576/512,e4m3]: KDTREE_VERIFY_SCHEDULE=cluster merges uniform splits in a cluster") {
  kdtree_verify_spec e4m3 = mla(8, 16);
  e4m3.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  const codegen::KernelSource sm120 =
      codegen::generate_verify_attention(codegen::validate_verify_spec(e4m3), codegen::arch_from_sm(120));
  REQUIRE(sm120.launch.cluster_merge);  // the qsplit e4m3 MMA kernel has the cluster entry
  CHECK(std::find(sm120.entry_points.begin(), sm120.entry_points.end(), "kdtree_verify_attention_cluster") !=
        sm120.entry_points.end());
  CHECK(sm120.source.find("kdtree_verify_attention_cluster") != std::string::npos);
  ScopedSchedule s("cluster");
  // B=64 H=8 n=8 4K (the bytes-bound bench shape): no partials, no workspace, no combine.
  const VerifyPlan b64 = plan(120, e4m3, 64, 8, 4096);
  CHECK(b64.cluster_splits >= 2);
  CHECK(b64.cluster_splits <= 8);
  CHECK(b64.num_splits == b64.cluster_splits);
  CHECK(b64.grid_z == unsigned(b64.cluster_splits));
  CHECK(b64.grid_y == 64u);
  CHECK(b64.stream_ctas == 0);
  CHECK(b64.workspace_bytes == 0);
  CHECK(b64.combine_grid_x == 0);
  CHECK(int64_t(b64.split_tokens) * b64.num_splits >= 4096 + 8);
  // A forced count up to 8 is taken; more is refused, naming num_splits.
  CHECK(plan(120, e4m3, 64, 8, 4096, 3).cluster_splits == 3);
  CHECK_THROWS_WITH_AS(plan(120, e4m3, 64, 8, 4096, 9), doctest::Contains("num_splits 9"), kdtree::Error);
  const VerifyPlan one = plan(120, e4m3, 64, 8, 4096, 1);  // one CTA a row tile: nothing to merge
  CHECK(one.cluster_splits == 0);
  CHECK(one.num_splits == 1);
  // One KV tile: nothing to split, an ordinary one-split launch.
  const VerifyPlan tiny = plan(120, e4m3, 1, 1, 0);
  CHECK(tiny.cluster_splits == 0);
  CHECK(tiny.num_splits == 1);
  // Kernels without the cluster entry (16-bit caches; sm_80, which has no clusters) are refused.
  CHECK_THROWS_WITH_AS(plan(120, mla(8, 16), 64, 8, 4096), doctest::Contains("KDTREE_VERIFY_SCHEDULE=cluster"),
                       kdtree::Error);
  CHECK_THROWS_WITH_AS(plan(80, e4m3, 64, 8, 4096), doctest::Contains("sm_80"), kdtree::Error);
}

TEST_CASE("verify_plan[mla576/512,sm_120]: where the KV's bytes bind, two splits (e4m3: merged in a cluster)") {
  const ScopedSchedule unset("");
  kdtree_verify_spec e4m3 = mla(8, 16);
  e4m3.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  // B=64 H=8 n=8 4K: 64 row tiles whose 151 MB of e4m3 KV take longer than their tiles on
  // 188 SMs, so stream-K's 188 CTAs gain nothing the partials and the combine do not cost.
  const VerifyPlan b64 = plan(120, e4m3, 64, 8, 4096);
  CHECK(b64.stream_ctas == 0);
  CHECK(b64.cluster_splits == 2);
  CHECK(b64.workspace_bytes == 0);
  CHECK(b64.combine_grid_x == 0);
  // Over a 16-bit cache its 302 MB bind as well: two uniform splits, whose partials cost less
  // than stream-K's; the 16-bit path has no cluster entry, so they go through the combine.
  const VerifyPlan b64_16 = plan(120, mla(8, 16), 64, 8, 4096);
  CHECK(b64_16.stream_ctas == 0);
  CHECK(b64_16.num_splits == 2);
  CHECK(b64_16.cluster_splits == 0);
  CHECK(b64_16.workspace_bytes > 0);
  // Compute-bound e4m3 calls keep stream-K (B=8 H=16 n=32 4K) or many uniform splits.
  kdtree_verify_spec e4m3_h16 = mla(16, 32);
  e4m3_h16.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  CHECK(plan(120, e4m3_h16, 8, 32, 4096).stream_ctas == 188);
  const VerifyPlan b1 = plan(120, e4m3_h16, 1, 16, 4096);
  CHECK(b1.num_splits > 2);
  CHECK(b1.cluster_splits == 0);
  // KDTREE_VERIFY_SCHEDULE=splits keeps the partials and the combine.
  const ScopedSchedule splits("splits");
  const VerifyPlan kept = plan(120, e4m3, 64, 8, 4096);
  CHECK(kept.num_splits == 2);
  CHECK(kept.cluster_splits == 0);
  CHECK(kept.workspace_bytes > 0);
}

TEST_CASE("verify_plan[mla576/512,sm_90]: the MLA wgmma kernels merge splits in a cluster, both cache types") {
  kdtree_verify_spec e4m3 = mla(8, 16);
  e4m3.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  for (const kdtree_verify_spec& s : {mla(8, 16), e4m3}) {
    INFO("kv_dtype " << int(s.kv_dtype));
    const codegen::KernelSource src =
        codegen::generate_verify_attention(codegen::validate_verify_spec(s), codegen::arch_from_sm(90));
    REQUIRE(src.launch.kernel.find("kernel=wgmma") == 0);
    REQUIRE(src.launch.cluster_merge);
    CHECK(std::find(src.entry_points.begin(), src.entry_points.end(), "kdtree_verify_attention_cluster") !=
          src.entry_points.end());
    CHECK(src.source.find("kdtree_verify_attention_cluster") != std::string::npos);
    {
      ScopedSchedule c("cluster");
      // B=64 H=8 n=8 4K: 64 row tiles on 132 SMs, two splits a row tile in one wave.
      const VerifyPlan b64 = plan(90, s, 64, 8, 4096);
      CHECK(b64.cluster_splits == 2);
      CHECK(b64.grid_z == 2u);
      CHECK(b64.workspace_bytes == 0);
      CHECK(b64.combine_grid_x == 0);
      CHECK(b64.stream_ctas == 0);
      CHECK(plan(90, s, 64, 8, 4096, 8).cluster_splits == 8);
    }
    // Without the override a plan of two uniform splits runs as a cluster (measured faster
    // on the H200); KDTREE_VERIFY_SCHEDULE=splits keeps the partials and the combine.
    {
      const ScopedSchedule unset("");
      const VerifyPlan b64 = plan(90, s, 64, 8, 4096);
      CHECK(b64.cluster_splits == 2);
      CHECK(b64.workspace_bytes == 0);
      CHECK(b64.combine_grid_x == 0);
      CHECK(plan(90, s, 64, 8, 4096, 2).cluster_splits == 2);
      CHECK(plan(90, s, 64, 8, 4096, 3).cluster_splits == 0);  // other counts: the combine
      CHECK(plan(90, s, 1, 16, 4096).cluster_splits == 0);     // many splits
    }
    const ScopedSchedule splits("splits");
    const VerifyPlan b64 = plan(90, s, 64, 8, 4096);
    CHECK(b64.num_splits == 2);
    CHECK(b64.cluster_splits == 0);
    CHECK(b64.workspace_bytes > 0);
  }
  // The GQA wgmma kernel has no cluster entry.
  const ScopedSchedule c("cluster");
  const kdtree_verify_spec gqa128{128, 128, 8, 1, 64, 64, KDTREE_DTYPE_BF16};
  CHECK_THROWS_WITH_AS(plan(90, gqa128, 4, 64, 8192), doctest::Contains("KDTREE_VERIFY_SCHEDULE=cluster"),
                       kdtree::Error);
}

TEST_CASE("verify_plan: max_kv_len at KDTREE_MAX_KV_LEN plans positive splits, past it is refused") {
  const ScopedSchedule unset("");
  const kdtree_verify_spec gqa64{64, 64, 8, 1, 64, 16, KDTREE_DTYPE_BF16};
  for (int sm : {90, 120}) {
    // Forced one split (the whole KV in one CTA), and the automatic plans (MLA on sm_120: stream-K).
    const VerifyPlan one = plan(sm, gqa64, 1, 16, KDTREE_MAX_KV_LEN - 16, 1);
    CHECK(one.num_splits == 1);
    CHECK(one.split_tokens >= KDTREE_MAX_KV_LEN);
    for (const kdtree_verify_spec& s : {gqa64, mla(16, 16)}) {
      const VerifyPlan automatic = plan(sm, s, 1, 16, KDTREE_MAX_KV_LEN - 16);
      CHECK(automatic.split_tokens > 0);
      CHECK(int64_t(automatic.split_tokens) * std::max(1, automatic.num_splits) >= KDTREE_MAX_KV_LEN);
    }
  }
  CHECK_NOTHROW(check_verify_sizes(gqa64, 16, 1, 16, KDTREE_MAX_KV_LEN, 1));
  for (int bad : {KDTREE_MAX_KV_LEN + 1, INT32_MAX, 0}) {
    CHECK_THROWS_WITH_AS(check_verify_sizes(gqa64, 16, 1, 16, bad, 1), doctest::Contains("max_kv_len"), kdtree::Error);
  }
}
