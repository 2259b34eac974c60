// The host e4m3 codec (reference/fp8.hpp) against the format's definition, and
// the float64 reference over e4m3 caches. CPU only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ios>
#include <string>
#include <vector>

#include "reference/fp8.hpp"
#include "reference/half.hpp"
#include "reference/verify_attention.hpp"
#include "reference/verify_case.hpp"

using kdtree::ref::e4m3_to_float;
using kdtree::ref::float_to_e4m3;

namespace {

// The definition, written independently of the codec: OCP e4m3fn, sign |
// 4 exponent bits (bias 7) | 3 mantissa bits; exponent 0 is subnormal
// (m / 8 x 2^-6); S.1111.111 is NaN; there are no infinities.
double e4m3_definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

bool finite_code(int code) { return (code & 0x7f) != 0x7f; }

}  // namespace

TEST_CASE("e4m3: all 256 codes decode to the format's definition") {
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    INFO("code 0x" << std::hex << code);
    const double want = e4m3_definition(code);
    const float got = e4m3_to_float(uint8_t(code));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      ++nans;
    } else {
      CHECK(double(got) == want);
      CHECK(std::signbit(got) == bool(code & 0x80));  // -0 keeps its sign
    }
  }
  CHECK(nans == 2);  // 0x7f and 0xff only
  CHECK(e4m3_to_float(0x7e) == 448.0f);
  CHECK(e4m3_to_float(0x38) == 1.0f);
  CHECK(e4m3_to_float(0x08) == std::ldexp(1.0f, -6));  // smallest normal
  CHECK(e4m3_to_float(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
  // Positive finite codes are increasing: the code order is the value order.
  for (int code = 1; code <= 0x7e; ++code) CHECK(e4m3_to_float(uint8_t(code)) > e4m3_to_float(uint8_t(code - 1)));
}

TEST_CASE("e4m3: encode(decode(code)) is the identity on every finite code") {
  for (int code = 0; code < 256; ++code) {
    if (!finite_code(code)) continue;
    INFO("code 0x" << std::hex << code);
    CHECK(int(float_to_e4m3(e4m3_to_float(uint8_t(code)))) == code);
  }
}

TEST_CASE("e4m3: encoding rounds to nearest, ties to even, and saturates") {
  for (int sign : {0, 0x80}) {
    for (int code = 0; code < 0x7e; ++code) {
      const int lo = sign | code, hi = sign | (code + 1);
      const double a = e4m3_to_float(uint8_t(lo)), b = e4m3_to_float(uint8_t(hi));
      const double mid = (a + b) / 2;  // exact in float: one more bit than e4m3
      INFO("between 0x" << std::hex << lo << " and 0x" << hi);
      const int even = (code & 1) == 0 ? lo : hi;  // the code whose mantissa ends in 0
      CHECK(int(float_to_e4m3(float(mid))) == even);
      CHECK(int(float_to_e4m3(std::nextafter(float(mid), float(a)))) == lo);
      CHECK(int(float_to_e4m3(std::nextafter(float(mid), float(b)))) == hi);
    }
  }
  // Past the largest finite value: +-448 (satfinite), never the NaN code.
  for (float x : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, INFINITY}) {
    INFO(x);
    CHECK(int(float_to_e4m3(x)) == 0x7e);
    CHECK(int(float_to_e4m3(-x)) == 0xfe);
  }
  CHECK(int(float_to_e4m3(NAN)) == 0x7f);
  CHECK(int(float_to_e4m3(-NAN)) == 0xff);
  CHECK(int(float_to_e4m3(0.0f)) == 0x00);
  CHECK(int(float_to_e4m3(-0.0f)) == 0x80);
  // Below half the smallest subnormal: zero (a tie with 0 goes to the even 0).
  CHECK(int(float_to_e4m3(std::ldexp(1.0f, -10))) == 0x00);
  CHECK(int(float_to_e4m3(std::ldexp(1.01f, -10))) == 0x01);
}

namespace {

// The e4m3 case with its caches dequantised into bf16 caches: code x scale is a
// 4-bit by 4-bit significand product (the scales are 2^e x (1 + m / 8)), so
// exact in bf16; the 16-bit reference over them must match the e4m3 reference.
kdtree::ref::VerifyCase dequantised_copy(const kdtree::ref::VerifyCase& c) {
  kdtree::ref::VerifyCase d = c;
  d.spec.kv_dtype = KDTREE_KV_DTYPE_AS_Q;
  auto widen = [&](const std::vector<uint8_t>& codes, float scale, std::vector<uint16_t>* out) {
    out->resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      const float x = e4m3_to_float(codes[i]) * scale;
      (*out)[i] = kdtree::ref::to_half(x, c.spec.dtype);
      if (!std::isnan(x)) REQUIRE(kdtree::ref::from_half((*out)[i], c.spec.dtype) == x);
    }
  };
  REQUIRE(c.spec.dtype == KDTREE_DTYPE_BF16);
  if (c.mla) {
    REQUIRE(c.k_scale == c.v_scale);  // one row, one scale, for the 16-bit copy
  }
  widen(c.k_cache8, c.k_scale, &d.k_cache);
  widen(c.v_cache8, c.v_scale, &d.v_cache);
  d.k_cache8.clear();
  d.v_cache8.clear();
  return d;
}

}  // namespace

TEST_CASE("verify_attention reference over e4m3 caches equals the reference over the dequantised cache") {
  using kdtree::ref::make_verify_spec;
  for (const auto& spec : {make_verify_spec(128, 128, 8, 2, 16, 32, KDTREE_DTYPE_BF16, KDTREE_KV_DTYPE_E4M3),
                           make_verify_spec(64, 64, 4, 4, 1, 16, KDTREE_DTYPE_BF16, KDTREE_KV_DTYPE_E4M3),
                           make_verify_spec(576, 512, 8, 1, 64, 16, KDTREE_DTYPE_BF16, KDTREE_KV_DTYPE_E4M3)}) {
    kdtree::ref::VerifyCaseOptions o;
    o.max_prefix = 150;
    o.unused = kdtree::ref::UnusedFill::random;
    if (spec.head_dim_qk == 576) o.k_scale = o.v_scale = 0.03125f * 1.375f;  // MLA: one scale for the copy
    const kdtree::ref::VerifyCase c = kdtree::ref::build_verify_case(spec, 3, 7, o);
    INFO(c.label());
    CHECK(c.label().find(",bf16,kv=e4m3,") != std::string::npos);
    CHECK(c.k_cache.empty());
    CHECK(c.k_cache8.size() == size_t(c.num_pages) * spec.page_size * spec.num_kv_heads * spec.head_dim_qk);
    CHECK(c.v_cache8.size() ==
          (c.mla ? 0 : size_t(c.num_pages) * spec.page_size * spec.num_kv_heads * spec.head_dim_v));
    CHECK(c.k_scale > 0);
    CHECK(c.v_scale > 0);
    const auto ref8 = kdtree::ref::verify_attention(c.host_inputs());
    const auto ref16 = kdtree::ref::verify_attention(dequantised_copy(c).host_inputs());
    double worst = 0;
    for (size_t i = 0; i < ref8.out.size(); ++i) worst = std::max(worst, std::fabs(ref8.out[i] - ref16.out[i]));
    for (size_t i = 0; i < ref8.lse.size(); ++i) worst = std::max(worst, std::fabs(ref8.lse[i] - ref16.lse[i]));
    CHECK(worst < 1e-12);
  }
}

TEST_CASE("verify_case: e4m3 cases share the 16-bit case's trees, pages and values") {
  using kdtree::ref::make_verify_spec;
  const auto spec16 = make_verify_spec(128, 128, 8, 2, 16, 64, KDTREE_DTYPE_BF16);
  auto spec8 = spec16;
  spec8.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  kdtree::ref::VerifyCaseOptions o;
  const auto c16 = kdtree::ref::build_verify_case(spec16, 4, 11, o);
  const auto c8 = kdtree::ref::build_verify_case(spec8, 4, 11, o);
  CHECK(c8.q == c16.q);
  CHECK(c8.page_table == c16.page_table);
  CHECK(c8.kv_lens == c16.kv_lens);
  CHECK(c8.tree_mask == c16.tree_mask);
  REQUIRE(c8.k_cache8.size() == c16.k_cache.size());
  for (size_t i = 0; i < c16.k_cache.size(); ++i) {
    const float x = kdtree::ref::from_half(c16.k_cache[i], spec16.dtype);
    const uint8_t want = std::isnan(x) ? kdtree::ref::kE4m3Nan : float_to_e4m3(x / c8.k_scale);
    if (c8.k_cache8[i] != want) {
      FAIL("k code " << i << " differs");
      break;
    }
  }
  // Unused rows hold NaN (the default fill), as codes too.
  CHECK(std::count(c8.k_cache8.begin(), c8.k_cache8.end(), kdtree::ref::kE4m3Nan) > 0);
  // 16-bit cases carry no codes and unit scales.
  CHECK(c16.k_cache8.empty());
  CHECK(c16.k_scale == 1.0f);
  CHECK(c16.label().find("kv=e4m3") == std::string::npos);
}
