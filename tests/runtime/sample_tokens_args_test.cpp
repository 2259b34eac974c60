// kdtree_sample_tokens rejects bad arguments on the host, through the C ABI,
// before it needs a driver: these run on CPU-only machines. Pointers are fake
// (never dereferenced: every call here must fail validation).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kdtree/kdtree.h"
#include "runtime/driver.hpp"
#include "tests/support/c_api_fixture.hpp"

using namespace kdtree::test;

namespace {

const char* const kTempDir = "kdtree-sample-args";

kdtree_sample_args good_args() {
  kdtree_sample_args a{};
  a.num_rows = 4;
  a.vocab_size = 32000;
  a.logits_dtype = KDTREE_DTYPE_BF16;
  a.logits = fake<const void>(1);
  a.row_stride = 0;
  a.temperature = 0.8f;
  a.seed = 1;
  a.row_offsets = nullptr;
  a.out_tokens = fake<int32_t>(2);
  return a;
}

void expect_error(kdtree_runtime* rt, const kdtree_sample_args& a, kdtree_status status, const char* field) {
  kdtree::test::expect_error(kdtree_sample_tokens, "kdtree_sample_tokens", rt, a, status, field);
}

}  // namespace

TEST_CASE("sample_tokens C ABI: NULL runtime and NULL args") {
  Fixture f(kTempDir);
  expect_null_runtime_and_args_rejected(kdtree_sample_tokens, good_args(), f.rt);
}

TEST_CASE("sample_tokens C ABI: unsupported logits dtype") {
  Fixture f(kTempDir);
  kdtree_sample_args a = good_args();
  a.logits_dtype = KDTREE_DTYPE_F16;
  expect_error(f.rt, a, KDTREE_ERROR_UNSUPPORTED, "BF16");
}

TEST_CASE("sample_tokens C ABI: a logits_dtype that is no kdtree_dtype is refused before use") {
  Fixture f(kTempDir);
  for (int32_t raw : kBadDtypes) {
    INFO("logits_dtype " << raw);
    kdtree_sample_args a = good_args();
    set_raw_dtype(a.logits_dtype, raw);
    expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "logits_dtype");
    CHECK(names(kdtree_last_error(), std::to_string(raw)));
  }
}

TEST_CASE("sample_tokens C ABI: bad sizes") {
  Fixture f(kTempDir);
  kdtree_sample_args a = good_args();
  a.num_rows = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "num_rows");
  a = good_args();
  a.num_rows = -3;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "num_rows");
  a = good_args();
  a.vocab_size = 0;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "vocab_size");
  a = good_args();
  a.row_stride = 31999;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_stride");
  a = good_args();
  a.row_stride = -1;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_stride");
}

TEST_CASE("sample_tokens C ABI: NULL and misaligned buffers") {
  Fixture f(kTempDir);
  kdtree_sample_args a = good_args();
  a.logits = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "logits");
  a = good_args();
  a.logits = fake<const void>(1, 1);  // bf16 needs 2-byte alignment
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "logits");
  a = good_args();
  a.logits_dtype = KDTREE_DTYPE_F32;
  a.logits = fake<const void>(1, 2);  // f32 needs 4-byte alignment
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "logits");
  a = good_args();
  a.out_tokens = nullptr;
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "out_tokens");
  a = good_args();
  a.out_tokens = fake<int32_t>(2, 2);
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "out_tokens");
  a = good_args();
  a.row_offsets = fake<const int64_t>(3, 4);
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "row_offsets");
}

TEST_CASE("sample_tokens C ABI: temperature NaN and +inf are refused, -inf is greedy (<= 0)") {
  Fixture f(kTempDir);
  kdtree_sample_args a = good_args();
  a.temperature = std::numeric_limits<float>::quiet_NaN();
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "temperature");
  a.temperature = std::numeric_limits<float>::infinity();
  expect_error(f.rt, a, KDTREE_ERROR_INVALID_ARGUMENT, "temperature");
  if (kdtree::driver::available()) return;  // would launch on fake pointers
  a.temperature = -std::numeric_limits<float>::infinity();
  const kdtree_status status = kdtree_sample_tokens(f.rt, &a);
  INFO(kdtree_last_error());
  CHECK((status == KDTREE_ERROR_NO_DRIVER || status == KDTREE_ERROR_NO_DEVICE));
}

TEST_CASE("sample_tokens C ABI: valid arguments pass host validation") {
  if (kdtree::driver::available()) return;  // would launch on fake pointers
  Fixture f(kTempDir);
  kdtree_sample_args a = good_args();
  const kdtree_status status = kdtree_sample_tokens(f.rt, &a);
  INFO(kdtree_last_error());
  CHECK((status == KDTREE_ERROR_NO_DRIVER || status == KDTREE_ERROR_NO_DEVICE));
}
