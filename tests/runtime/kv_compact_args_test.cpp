// kdtree_kv_compact rejects bad arguments on the host, through the C ABI, before
// it needs a driver: these run on CPU-only machines. Pointers are fake (never
// dereferenced: every call here must fail validation). Paths, node counts and
// page ids are device data, checked by the kernel (tests/ops/kv_compact_gpu.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "kdtree/kdtree.h"
#include "runtime/driver.hpp"
#include "tests/support/c_api_fixture.hpp"

using namespace kdtree::test;

namespace {

const char* const kTempDir = "kdtree-kv-compact-args";

// MLA: one cache of 576-element rows per layer.
kdtree_kv_compact_args good_args() {
  kdtree_kv_compact_args a{};
  a.num_layers = 61;
  a.batch_size = 8;
  a.max_tree_nodes = 64;
  a.page_size = 16;
  a.num_pages = 1000;
  a.row_elems_k = 576;
  a.row_elems_v = 0;
  a.dtype = KDTREE_DTYPE_BF16;
  a.k_caches = fake<const uint64_t>(1);
  a.v_caches = nullptr;
  a.page_table = fake<const int32_t>(2);
  a.max_pages_per_req = 64;
  a.kv_lens = fake<const int32_t>(3);
  a.node_counts = fake<const int32_t>(4);
  a.accepted_path = fake<const int32_t>(5);
  a.accept_lens = fake<const int32_t>(6);
  a.error_flags = nullptr;
  return a;
}

kdtree_kv_compact_args gqa_args() {
  kdtree_kv_compact_args a = good_args();
  a.row_elems_k = 1024;
  a.row_elems_v = 1024;
  a.v_caches = fake<const uint64_t>(7);
  return a;
}

void expect_error(kdtree_runtime* rt, const kdtree_kv_compact_args& a, kdtree_status status, const char* field) {
  kdtree::test::expect_error(kdtree_kv_compact, "kdtree_kv_compact", rt, a, status, field);
}

}  // namespace

TEST_CASE("kv_compact C ABI: NULL runtime and NULL args") {
  Fixture f(kTempDir);
  expect_null_runtime_and_args_rejected(kdtree_kv_compact, good_args(), f.rt);
}

TEST_CASE("kv_compact C ABI: unsupported spec and dtype") {
  Fixture f(kTempDir);
  kdtree_kv_compact_args a = good_args();
  a.max_tree_nodes = 48;
  expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "max_tree_nodes");
  a = good_args();
  a.page_size = 8;
  expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "page_size");
  a = good_args();
  a.dtype = KDTREE_DTYPE_F32;
  expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "dtype");
}

TEST_CASE("kv_compact C ABI: a dtype that is no kdtree_dtype is refused before use") {
  Fixture f(kTempDir);
  for (int32_t raw : kBadDtypes) {
    INFO("dtype " << raw);
    kdtree_kv_compact_args a = good_args();
    set_raw_dtype(a.dtype, raw);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "dtype");
    CHECK(names(kdtree_last_error(), std::to_string(raw)));
  }
}

TEST_CASE("kv_compact C ABI: bad counts") {
  Fixture f(kTempDir);
  kdtree_kv_compact_args a = good_args();
  a.num_layers = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "num_layers");
  a.num_layers = 70000;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "num_layers");
  a = good_args();
  a.batch_size = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "batch_size");
  a = good_args();
  a.num_pages = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "num_pages");
  a = good_args();
  a.max_pages_per_req = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "max_pages_per_req");
}

TEST_CASE("kv_compact C ABI: row sizes must be positive multiples of 8 (16-byte rows)") {
  Fixture f(kTempDir);
  kdtree_kv_compact_args a = good_args();
  a.row_elems_k = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_k");
  a.row_elems_k = 100;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_k");
  a = gqa_args();
  a.row_elems_v = -8;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_v");
  a.row_elems_v = 12;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_v");
  // Rows past 1 GiB: their widths in 16-byte vectors once overflowed int (a zero or a
  // wrapped grid, the K rows silently not moved).
  a = gqa_args();
  a.row_elems_k = 2147483640;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_k");
  a = gqa_args();
  a.row_elems_v = 1 << 30;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_v");
}

TEST_CASE("kv_compact C ABI: e4m3 rows are multiples of 16 bytes, kv_dtype must be a kdtree_kv_dtype") {
  Fixture f(kTempDir);
  kdtree_kv_compact_args a = good_args();
  a.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  a.row_elems_k = 8;  // 8 bytes: half a vector
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_k");
  a.row_elems_k = 584;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_k");
  a = gqa_args();
  a.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  a.row_elems_v = 72;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_elems_v");
  for (int32_t bad : {2, 7, -1}) {
    a = good_args();
    set_raw_kv_dtype(a.kv_dtype, bad);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "kv_dtype");
  }
}

TEST_CASE("kv_compact C ABI: NULL and misaligned buffers") {
  Fixture f(kTempDir);
  kdtree_kv_compact_args a = good_args();
  a.k_caches = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "k_caches");
  a = good_args();
  a.k_caches = fake<const uint64_t>(1, 4);
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "k_caches");
  a = good_args();  // MLA has one cache
  a.v_caches = fake<const uint64_t>(7);
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "v_caches");
  a = gqa_args();  // GQA needs both
  a.v_caches = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "v_caches");
  a = good_args();
  a.page_table = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "page_table");
  a = good_args();
  a.kv_lens = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "kv_lens");
  a = good_args();
  a.node_counts = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "node_counts");
  a = good_args();
  a.accepted_path = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "accepted_path");
  a = good_args();
  a.accept_lens = fake<const int32_t>(6, 2);
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "accept_lens");
  a = good_args();
  a.accept_lens = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "accept_lens");
  a = good_args();
  a.error_flags = fake<int32_t>(8, 1);
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "error_flags");
}

TEST_CASE("kv_compact C ABI: valid arguments pass host validation") {
  if (kdtree::driver::available()) return;  // would launch on fake pointers
  Fixture f(kTempDir);
  kdtree_kv_compact_args mla8 = good_args(), gqa8 = gqa_args();
  mla8.kv_dtype = gqa8.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  gqa8.row_elems_k = gqa8.row_elems_v = 64;  // one e4m3 head of 64: a 64-byte row
  for (const kdtree_kv_compact_args& a : {good_args(), gqa_args(), mla8, gqa8}) {
    const kdtree_status status = kdtree_kv_compact(f.rt, &a);
    INFO(kdtree_last_error());
    CHECK((status == KDTREE_ERROR_NO_DRIVER || status == KDTREE_ERROR_NO_DEVICE));
  }
}
