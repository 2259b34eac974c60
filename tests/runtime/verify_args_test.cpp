// kdtree_verify_attention rejects bad arguments on the host, through the C ABI,
// before it needs a driver: these run on CPU-only machines (CI). Pointers are
// fake (never dereferenced: every call here must fail validation). Message
// texts belong to the implementation; only the field names are checked.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "codegen/verify_attention.hpp"
#include "kdtree/kdtree.h"
#include "runtime/driver.hpp"
#include "tests/support/c_api_fixture.hpp"
#include "tests/support/env_var.hpp"

using namespace kdtree::test;

namespace {

const char* const kTempDir = "kdtree-verify-args";

kdtree_verify_spec gqa_spec() {
  kdtree_verify_spec s{};
  s.head_dim_qk = 128;
  s.head_dim_v = 128;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.page_size = 16;
  s.max_tree_nodes = 64;
  s.dtype = KDTREE_DTYPE_BF16;
  return s;
}

kdtree_verify_spec mla_spec() {
  kdtree_verify_spec s{};
  s.head_dim_qk = 576;
  s.head_dim_v = 512;
  s.num_q_heads = 16;
  s.num_kv_heads = 1;
  s.page_size = 64;
  s.max_tree_nodes = 64;
  s.dtype = KDTREE_DTYPE_BF16;
  return s;
}

// Well-formed arguments (with fake device pointers); each test breaks one thing.
kdtree_verify_args good_args(const kdtree_verify_spec& spec) {
  kdtree_verify_args a{};
  a.spec = spec;
  a.batch_size = 3;
  a.total_nodes = 70;
  a.max_kv_len = 3000;
  a.num_pages = 200;
  a.q = fake<const void>(1);
  a.node_indptr = fake<const int32_t>(2);
  a.k_cache = fake<const void>(3);
  a.v_cache = spec.head_dim_qk == 576 ? nullptr : fake<const void>(4);
  a.page_table = fake<const int32_t>(5);
  a.max_pages_per_req = 64;
  a.kv_lens = fake<const int32_t>(6);
  a.tree_mask = fake<const uint64_t>(7);
  a.sm_scale = 0.0625f;
  a.out = fake<void>(8);  // MLA's out takes 1.1 MB: two slots of the fixture's
  a.lse = fake<float>(10);
  a.workspace = fake<void>(12);
  a.workspace_size = size_t(1) << 34;
  a.error_flags = nullptr;
  a.stream = nullptr;
  a.num_splits = 1;
  return a;
}

// Runs the call and checks the status and that the message names every field.
void expect_rejected(kdtree_runtime* rt, const kdtree_verify_args& a, kdtree_status status,
                     std::initializer_list<const char*> fields) {
  const kdtree_status got = kdtree_verify_attention(rt, &a);
  const std::string msg = kdtree_last_error();
  INFO("message: " << msg);
  CHECK(got == status);
  for (const char* f : fields) {
    INFO("field: " << std::string(f));
    CHECK(names(msg, f));
  }
}

}  // namespace

TEST_CASE("verify_args: unsupported specs are KDTREE_ERROR_UNSUPPORTED and say what is supported") {
  Fixture fx(kTempDir);
  SUBCASE("head dim 96") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.head_dim_qk = a.spec.head_dim_v = 96;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"head_dim_qk", "64", "128", "256", "576"});
  }
  SUBCASE("head_dim_v differs from head_dim_qk for GQA") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.head_dim_v = 64;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"head_dim_v"});
  }
  SUBCASE("MLA with head_dim_v 256") {
    kdtree_verify_args a = good_args(mla_spec());
    a.spec.head_dim_v = 256;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"head_dim_v"});
  }
  SUBCASE("W = 48") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.max_tree_nodes = 48;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"max_tree_nodes"});
  }
  SUBCASE("W = 256") {
    kdtree_verify_args a = good_args(mla_spec());
    a.spec.max_tree_nodes = 256;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"max_tree_nodes"});
  }
  SUBCASE("page size 8") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.page_size = 8;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"page_size"});
  }
  SUBCASE("page size 0") {
    kdtree_verify_args a = good_args(mla_spec());
    a.spec.page_size = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"page_size"});
  }
  SUBCASE("dtype F32") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.dtype = KDTREE_DTYPE_F32;
    expect_rejected(fx.rt, a, KDTREE_ERROR_UNSUPPORTED, {"dtype"});
  }
}

TEST_CASE("verify_args: a dtype that is no kdtree_dtype is refused before use - attention, workspace size, warm") {
  Fixture fx(kTempDir);
  for (int32_t raw : kBadDtypes) {
    INFO("dtype " << raw);
    kdtree_verify_args a = good_args(mla_spec());
    set_raw_dtype(a.spec.dtype, raw);
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"dtype", std::to_string(raw).c_str()});
    size_t bytes = 0;
    CHECK(kdtree_verify_workspace_size(fx.rt, &a.spec, 4, 8, 1000, &bytes) == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(names(kdtree_last_error(), "dtype"));
    CHECK(kdtree_warm(fx.rt, &a.spec) == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(names(kdtree_last_error(), "kdtree_warm"));
  }
}

namespace {

kdtree_verify_args e4m3_args(const kdtree_verify_spec& spec) {
  kdtree_verify_args a = good_args(spec);
  a.spec.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  a.k_scale = 0.02f;
  a.v_scale = 3.5f;
  return a;
}

}  // namespace

TEST_CASE("verify_args: a kv_dtype that is no kdtree_kv_dtype is refused - attention, workspace size, warm") {
  Fixture fx(kTempDir);
  for (int32_t raw : {2, 7, 1000, -1}) {
    INFO("kv_dtype " << raw);
    kdtree_verify_args a = good_args(mla_spec());
    set_raw_kv_dtype(a.spec.kv_dtype, raw);
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"kv_dtype", std::to_string(raw).c_str()});
    size_t bytes = 0;
    CHECK(kdtree_verify_workspace_size(fx.rt, &a.spec, 4, 8, 1000, &bytes) == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(names(kdtree_last_error(), "kv_dtype"));
    CHECK(kdtree_warm(fx.rt, &a.spec) == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(names(kdtree_last_error(), "kv_dtype"));
  }
}

TEST_CASE("verify_args: e4m3 scales must be positive and finite") {
  Fixture fx(kTempDir);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const kdtree_verify_spec& spec : {mla_spec(), gqa_spec()}) {
    for (float bad : {0.0f, -0.0f, -1.0f, nan, inf, -inf}) {
      INFO("head_dim_qk " << spec.head_dim_qk << ", scale " << bad);
      kdtree_verify_args a = e4m3_args(spec);
      a.k_scale = bad;
      expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"k_scale"});
      if (bad == -1.0f) CHECK(std::string(kdtree_last_error()).find("-1") != std::string::npos);
      a = e4m3_args(spec);
      a.v_scale = bad;
      expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"v_scale"});
      if (std::isnan(bad)) CHECK(std::string(kdtree_last_error()).find("nan") != std::string::npos);
      if (std::isinf(bad)) CHECK(std::string(kdtree_last_error()).find("inf") != std::string::npos);
    }
  }
}

TEST_CASE("verify_args: scales apply to e4m3 caches only - 16-bit caches take 0 or 1") {
  Fixture fx(kTempDir);
  for (float bad : {2.0f, 0.5f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("scale " << bad);
    kdtree_verify_args a = good_args(gqa_spec());
    a.k_scale = bad;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"k_scale", "e4m3"});
    a = good_args(mla_spec());
    a.v_scale = bad;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"v_scale", "e4m3"});
  }
  if (kdtree::driver::available()) return;  // the accepted ones would launch on fake pointers
  for (float ok : {0.0f, 1.0f}) {
    kdtree_verify_args a = good_args(gqa_spec());
    a.k_scale = ok;
    a.v_scale = 1.0f - ok;
    const kdtree_status st = kdtree_verify_attention(fx.rt, &a);
    INFO(kdtree_last_error());
    CHECK((st == KDTREE_ERROR_NO_DRIVER || st == KDTREE_ERROR_NO_DEVICE));
  }
}

TEST_CASE("verify_args: well-formed e4m3 arguments pass the host checks") {
  if (kdtree::driver::available()) return;  // would launch on fake pointers
  Fixture fx(kTempDir);
  for (const kdtree_verify_spec& spec : {mla_spec(), gqa_spec()}) {
    const kdtree_verify_args a = e4m3_args(spec);
    const kdtree_status st = kdtree_verify_attention(fx.rt, &a);
    const std::string msg = kdtree_last_error();
    INFO(msg);
    CHECK((st == KDTREE_ERROR_NO_DRIVER || st == KDTREE_ERROR_NO_DEVICE));
  }
}

TEST_CASE("verify_args: an offline runtime plans and compiles e4m3 specs") {
  TempDir dir(kTempDir);
  kdtree_runtime* rt = nullptr;
  REQUIRE(kdtree_runtime_create_offline(120, dir.path.c_str(), &rt) == KDTREE_OK);
  kdtree_verify_spec spec = mla_spec();
  spec.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  size_t bytes = 0;
  const kdtree_status st = kdtree_verify_workspace_size(rt, &spec, 1, 64, 64 * 1024, &bytes);
  INFO(kdtree_last_error());
  CHECK(st == KDTREE_OK);
  CHECK(bytes > 0);  // 64 nodes x 64K tokens on sm_120: split or stream-K partials
  CHECK(kdtree_warm(rt, &spec) == KDTREE_OK);
  kdtree_runtime_destroy(rt);
}

TEST_CASE("verify_args: inconsistent head counts are KDTREE_ERROR_INVALID_ARGUMENT") {
  Fixture fx(kTempDir);
  SUBCASE("num_q_heads not a multiple of num_kv_heads") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.num_q_heads = 6;
    a.spec.num_kv_heads = 4;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"num_q_heads", "num_kv_heads"});
  }
  SUBCASE("num_q_heads 0") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.num_q_heads = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"num_q_heads"});
  }
  SUBCASE("num_kv_heads 0") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.spec.num_kv_heads = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"num_kv_heads"});
  }
  SUBCASE("MLA with two KV heads") {
    kdtree_verify_args a = good_args(mla_spec());
    a.spec.num_kv_heads = 2;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"num_kv_heads"});
  }
}

TEST_CASE("verify_args: v_cache must be NULL for MLA and given for GQA") {
  Fixture fx(kTempDir);
  SUBCASE("MLA with a v_cache") {
    kdtree_verify_args a = good_args(mla_spec());
    a.v_cache = fake<const void>(4);
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"v_cache"});
  }
  SUBCASE("GQA without a v_cache") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.v_cache = nullptr;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"v_cache"});
  }
}

TEST_CASE("verify_args: NULL device pointers are named") {
  Fixture fx(kTempDir);
  struct Nulled {
    const char* field;
    void (*clear)(kdtree_verify_args&);
  };
#define NULLED(F)                                     \
  Nulled {                                            \
#F, [](kdtree_verify_args & a) { a.F = nullptr; } \
  }
  const Nulled nulled[] = {NULLED(q),       NULLED(k_cache),     NULLED(out),      NULLED(page_table),
                           NULLED(kv_lens), NULLED(node_indptr), NULLED(tree_mask)};
#undef NULLED
  for (const kdtree_verify_spec& spec : {gqa_spec(), mla_spec()}) {
    const bool mla = spec.head_dim_qk == 576;
    INFO((mla ? "mla" : "gqa"));
    for (const Nulled& n : nulled) {
      kdtree_verify_args a = good_args(spec);
      n.clear(a);
      expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {n.field});
    }
  }
}

TEST_CASE("verify_args: sizes") {
  Fixture fx(kTempDir);
  SUBCASE("batch_size 0") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.batch_size = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"batch_size"});
  }
  SUBCASE("batch_size -1") {
    kdtree_verify_args a = good_args(mla_spec());
    a.batch_size = -1;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"batch_size"});
  }
  SUBCASE("total_nodes > batch_size * W") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.batch_size = 2;
    a.total_nodes = 2 * 64 + 1;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"total_nodes"});
  }
  SUBCASE("total_nodes 0") {
    kdtree_verify_args a = good_args(mla_spec());
    a.total_nodes = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"total_nodes"});
  }
  for (float scale : {0.0f, -0.125f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SUBCASE(("sm_scale " + std::to_string(scale)).c_str()) {
      kdtree_verify_args a = good_args(mla_spec());
      a.sm_scale = scale;
      expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"sm_scale", "positive"});
    }
  }
  SUBCASE("workspace too small for forced splits") {
    kdtree_verify_args a = good_args(mla_spec());
    a.num_splits = 3;
    a.max_kv_len = 4096;
    a.workspace = nullptr;
    a.workspace_size = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"workspace"});
  }
  SUBCASE("workspace of 16 bytes for forced splits") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.num_splits = 3;
    a.max_kv_len = 4096;
    a.workspace_size = 16;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"workspace"});
  }
}

TEST_CASE("verify_args: NULL runtime and NULL args") {
  Fixture fx(kTempDir);
  expect_null_runtime_and_args_rejected(kdtree_verify_attention, good_args(gqa_spec()), fx.rt);
}

TEST_CASE("verify_args: kdtree_verify_workspace_size and kdtree_warm validate the spec too") {
  Fixture fx(kTempDir);
  kdtree_verify_spec s = gqa_spec();
  s.head_dim_qk = s.head_dim_v = 96;
  size_t bytes = 0;
  CHECK(kdtree_verify_workspace_size(fx.rt, &s, 2, 10, 100, &bytes) == KDTREE_ERROR_UNSUPPORTED);
  CHECK(names(kdtree_last_error(), "head_dim_qk"));
  s = mla_spec();
  s.page_size = 8;
  CHECK(kdtree_warm(fx.rt, &s) == KDTREE_ERROR_UNSUPPORTED);
  CHECK(names(kdtree_last_error(), "page_size"));
  s = gqa_spec();
  CHECK(kdtree_verify_workspace_size(fx.rt, &s, 0, 10, 100, &bytes) == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(names(kdtree_last_error(), "batch_size"));
  CHECK(kdtree_verify_workspace_size(fx.rt, &s, 2, 10, 100, nullptr) == KDTREE_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("verify_args: the last error describes the latest failed call") {
  // The thread-local message always describes the latest failed call.
  Fixture fx(kTempDir);
  kdtree_verify_args a = good_args(gqa_spec());
  a.spec.page_size = 8;
  CHECK(kdtree_verify_attention(fx.rt, &a) == KDTREE_ERROR_UNSUPPORTED);
  CHECK(names(kdtree_last_error(), "page_size"));
  a = good_args(gqa_spec());
  a.kv_lens = nullptr;
  CHECK(kdtree_verify_attention(fx.rt, &a) == KDTREE_ERROR_INVALID_ARGUMENT);
  const std::string msg = kdtree_last_error();
  CHECK(names(msg, "kv_lens"));
  CHECK(!names(msg, "page_size"));
}

namespace {

// A compile-only sm_120 runtime: the checks and the split plan run without a GPU
// (kdtree_verify_workspace_size answers), and a launch ends in KDTREE_ERROR_NO_DEVICE.
struct OfflineFixture {
  TempDir dir;
  kdtree_runtime* rt = nullptr;
  OfflineFixture() : dir(kTempDir) { REQUIRE(kdtree_runtime_create_offline(120, dir.path.c_str(), &rt) == KDTREE_OK); }
  ~OfflineFixture() { kdtree_runtime_destroy(rt); }
};

// Sets KDTREE_VERIFY_TILES for one scope.
struct TilesEnv : kdtree::test::EnvVar {
  explicit TilesEnv(const char* value) : EnvVar("KDTREE_VERIFY_TILES", value) {}
};

}  // namespace

TEST_CASE("verify_args: KDTREE_VERIFY_TILES with a zero or negative block is an error, not SIGFPE") {
  // These once passed the override's checks and divided by zero in the split plan.
  for (const char* tiles : {"block_m=64,block_n=0,warps=8,stages=2,warp_rows=32", "block_n=-16"}) {
    INFO("KDTREE_VERIFY_TILES=" << tiles);
    OfflineFixture fx;  // a fresh runtime: sources are generated once per runtime
    TilesEnv env(tiles);
    size_t bytes = 0;
    const kdtree_verify_spec spec = mla_spec();
    CHECK(kdtree_verify_workspace_size(fx.rt, &spec, 3, 70, 3000, &bytes) == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(names(kdtree_last_error(), "KDTREE_VERIFY_TILES"));
    CHECK(names(kdtree_last_error(), "block_n"));
    kdtree_verify_args a = good_args(spec);
    a.num_splits = 0;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"KDTREE_VERIFY_TILES", "block_n"});
  }
}

TEST_CASE("verify_args: an offline runtime plans without a GPU and stops at the launch") {
  OfflineFixture fx;
  const kdtree_verify_spec spec = mla_spec();
  size_t bytes = 1;
  REQUIRE(kdtree_verify_workspace_size(fx.rt, &spec, 1, 64, 64 * 1024, &bytes) == KDTREE_OK);
  CHECK(bytes > 0);  // one long request on 188 SMs is split
  kdtree_verify_args a = good_args(spec);
  expect_rejected(fx.rt, a, KDTREE_ERROR_NO_DEVICE, {});
}

TEST_CASE("verify_args: grid limits, forced splits, workspace alignment and the order of the size checks") {
  Fixture fx(kTempDir);
  SUBCASE("batch_size x num_kv_heads past the grid's y limit") {
    kdtree_verify_args a = good_args(gqa_spec());  // 2 KV heads
    a.batch_size = 40000;
    a.total_nodes = 40000;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"batch_size", "num_kv_heads", "65535"});
    size_t bytes = 0;
    CHECK(kdtree_verify_workspace_size(fx.rt, &a.spec, 40000, 40000, 3000, &bytes) == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(names(kdtree_last_error(), "num_kv_heads"));
  }
  SUBCASE("MLA batch of 65536") {
    kdtree_verify_args a = good_args(mla_spec());
    a.batch_size = 65536;
    a.total_nodes = 65536;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"batch_size", "num_kv_heads"});
  }
  SUBCASE("total_nodes x num_q_heads past 2^31 - 1 rows") {
    kdtree_verify_args a = good_args(mla_spec());
    a.spec.num_q_heads = 1024;
    a.batch_size = 60000;
    a.total_nodes = 3000000;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"total_nodes", "num_q_heads"});
  }
  SUBCASE("forced num_splits past the grid's z limit") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.num_splits = 65536;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"num_splits"});
    a.num_splits = -1;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"num_splits"});
  }
  SUBCASE("a workspace that is not 16-byte aligned (the combine kernel reads float4)") {
    kdtree_verify_args a = good_args(mla_spec());
    a.num_splits = 3;
    a.workspace = fake<void>(12, 4);
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"workspace", "aligned"});
  }
  SUBCASE("a negative total_nodes is named before any workspace size is computed from it") {
    kdtree_verify_args a = good_args(gqa_spec());
    a.num_splits = 3;
    a.total_nodes = -1;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"total_nodes"});
    CHECK(!names(kdtree_last_error(), "workspace"));
  }
}

TEST_CASE("verify_args: out 8-byte aligned, error_flags 4-byte aligned, outputs in buffers of their own") {
  Fixture fx(kTempDir);
  for (const kdtree_verify_spec& spec : {gqa_spec(), mla_spec()}) {
    INFO((spec.head_dim_qk == 576 ? "mla" : "gqa"));
    kdtree_verify_args a = good_args(spec);
    a.out = fake<void>(8, 4);  // e4m3 caches and sm_90's MLA kernels store out 8 bytes at a time
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"out"});
    a = good_args(spec);
    a.error_flags = fake<int32_t>(14, 2);
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"error_flags"});
    a = good_args(spec);
    a.lse = reinterpret_cast<float*>(a.out) + 64;
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"out", "lse"});
    a = good_args(spec);
    a.error_flags = reinterpret_cast<int32_t*>(a.lse);
    expect_rejected(fx.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, {"lse", "error_flags"});
  }
}
