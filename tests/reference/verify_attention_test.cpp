// The float64 verify_attention reference against hand-worked cases, and the
// random case builder's invariants. CPU only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include "reference/half.hpp"
#include "reference/verify_attention.hpp"
#include "reference/verify_case.hpp"

using kdtree::ref::from_half;
using kdtree::ref::to_half;
using kdtree::ref::VerifyCase;
using kdtree::ref::VerifyHostInputs;

namespace {

using kdtree::ref::make_verify_spec;

// A small hand-written problem: page size 1 with the identity page table, so
// logical token t of request b is physical page `first_page[b] + t`.
struct Tiny {
  kdtree_verify_spec spec{};
  std::vector<int> kv_lens_host, nodes;
  std::vector<float> q, k, v;  // float values, exactly representable in bf16
  std::vector<uint64_t> mask;
  double sm_scale = 1.0;
  bool mla = false;

  // Storage for the inputs (kept alive with the object).
  std::vector<uint16_t> q16, k16, v16;
  std::vector<int32_t> table, kv_lens, indptr;
  int num_pages = 0;

  Tiny(int dqk, int dv, int hq, int hkv, int W, std::vector<int> kv, std::vector<int> node_counts, bool is_mla = false)
      : kv_lens_host(kv), nodes(node_counts), mla(is_mla) {
    spec.head_dim_qk = dqk;
    spec.head_dim_v = dv;
    spec.num_q_heads = hq;
    spec.num_kv_heads = hkv;
    spec.page_size = 1;
    spec.max_tree_nodes = W;
    spec.dtype = KDTREE_DTYPE_BF16;
    num_pages = std::accumulate(kv.begin(), kv.end(), 0);
    const int total = std::accumulate(node_counts.begin(), node_counts.end(), 0);
    q.assign(size_t(total) * hq * dqk, 0.0f);
    k.assign(size_t(num_pages) * hkv * dqk, 0.0f);
    if (!mla) v.assign(size_t(num_pages) * hkv * dv, 0.0f);
    mask.assign(size_t(total) * ((W + 63) / 64), 0);
  }
  int batch() const { return int(nodes.size()); }
  int first_page(int b) const { return std::accumulate(kv_lens_host.begin(), kv_lens_host.begin() + b, 0); }
  int first_node(int b) const { return std::accumulate(nodes.begin(), nodes.begin() + b, 0); }
  float* k_at(int b, int t, int h = 0) {
    return &k[(size_t(first_page(b) + t) * spec.num_kv_heads + h) * spec.head_dim_qk];
  }
  float* v_at(int b, int t, int h = 0) {
    return &v[(size_t(first_page(b) + t) * spec.num_kv_heads + h) * spec.head_dim_v];
  }
  float* q_at(int b, int i, int h = 0) {
    return &q[(size_t(first_node(b) + i) * spec.num_q_heads + h) * spec.head_dim_qk];
  }
  void see(int b, int i, int j) {  // node i of request b sees tree node j
    mask[size_t(first_node(b) + i) * ((spec.max_tree_nodes + 63) / 64) + j / 64] |= uint64_t(1) << (j % 64);
  }

  VerifyHostInputs inputs() {
    auto pack = [](const std::vector<float>& x) {
      std::vector<uint16_t> h(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        h[i] = to_half(x[i], KDTREE_DTYPE_BF16);
        REQUIRE(from_half(h[i], KDTREE_DTYPE_BF16) == x[i]);  // hand values must be exact
      }
      return h;
    };
    q16 = pack(q);
    k16 = pack(k);
    v16 = pack(v);
    const int max_pages = *std::max_element(kv_lens_host.begin(), kv_lens_host.end());
    table.assign(size_t(batch()) * max_pages, -1);
    indptr.assign(batch() + 1, 0);
    kv_lens.assign(kv_lens_host.begin(), kv_lens_host.end());
    for (int b = 0; b < batch(); ++b) {
      for (int t = 0; t < kv_lens_host[b]; ++t) table[size_t(b) * max_pages + t] = first_page(b) + t;
      indptr[b + 1] = indptr[b] + nodes[b];
    }
    VerifyHostInputs in;
    in.spec = spec;
    in.batch_size = batch();
    in.total_nodes = indptr.back();
    in.num_pages = num_pages;
    in.max_pages_per_req = max_pages;
    in.q = q16.data();
    in.node_indptr = indptr.data();
    in.k_cache = k16.data();
    in.v_cache = mla ? nullptr : v16.data();
    in.page_table = table.data();
    in.kv_lens = kv_lens.data();
    in.tree_mask = mask.data();
    in.sm_scale = sm_scale;
    return in;
  }
};

const double* out_row(const kdtree::ref::VerifyReference& r, const kdtree_verify_spec& s, int node, int h = 0) {
  return &r.out[(size_t(node) * s.num_q_heads + h) * s.head_dim_v];
}

// An independent formulation for cross-checking: gather each request's KV
// contiguously, derive visibility by walking the parents (not from the masks),
// and take the softmax without the max shift (values are small).
kdtree::ref::VerifyReference dense_attention(const VerifyCase& c) {
  const auto& s = c.spec;
  const int group = s.num_q_heads / s.num_kv_heads;
  kdtree::ref::VerifyReference r;
  r.out.assign(c.out_elems(), 0.0);
  r.lse.assign(c.lse_elems(), 0.0);
  for (int b = 0; b < c.batch_size; ++b) {
    const int n = c.node_counts[b], prefix = c.prefix_lens[b], base = c.node_indptr[b];
    auto value = [&](const std::vector<uint16_t>& cache, int dim, int t, int h, int d) {
      const int page = c.page_table[size_t(b) * c.max_pages_per_req + t / s.page_size];
      return double(
          from_half(cache[((size_t(page) * s.page_size + t % s.page_size) * s.num_kv_heads + h) * dim + d], s.dtype));
    };
    for (int i = 0; i < n; ++i) {
      std::vector<bool> visible(prefix + n, false);
      for (int t = 0; t < prefix; ++t) visible[t] = true;
      for (int j = i; j >= 0; j = c.parents[base + j]) visible[prefix + j] = true;
      for (int h = 0; h < s.num_q_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> w(prefix + n, 0.0);
        double sum = 0.0;
        for (int t = 0; t < prefix + n; ++t) {
          if (!visible[t]) continue;
          double dot = 0.0;
          for (int d = 0; d < s.head_dim_qk; ++d)
            dot += double(from_half(c.q[(size_t(base + i) * s.num_q_heads + h) * s.head_dim_qk + d], s.dtype)) *
                   value(c.k_cache, s.head_dim_qk, t, kvh, d);
          w[t] = std::exp(double(c.sm_scale) * dot);
          sum += w[t];
        }
        double* out = &r.out[(size_t(base + i) * s.num_q_heads + h) * s.head_dim_v];
        for (int t = 0; t < prefix + n; ++t) {
          if (!visible[t]) continue;
          for (int d = 0; d < s.head_dim_v; ++d)
            out[d] += w[t] / sum *
                      (c.mla ? value(c.k_cache, s.head_dim_qk, t, kvh, d) : value(c.v_cache, s.head_dim_v, t, kvh, d));
        }
        r.lse[size_t(base + i) * s.num_q_heads + h] = std::log(sum);
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("verify_attention reference: a single visible token gives out = v") {
  Tiny t(4, 4, 1, 1, 16, {1}, {1});
  t.sm_scale = 0.5;
  const float q[4] = {1, 2, 0, -1}, k[4] = {0.5f, 1, 3, 2}, v[4] = {1, -2, 0.5f, 3};
  std::copy(q, q + 4, t.q_at(0, 0));
  std::copy(k, k + 4, t.k_at(0, 0));
  std::copy(v, v + 4, t.v_at(0, 0));
  t.see(0, 0, 0);
  const auto r = kdtree::ref::verify_attention(t.inputs());
  for (int d = 0; d < 4; ++d) CHECK(out_row(r, t.spec, 0)[d] == v[d]);
  CHECK(r.lse[0] == doctest::Approx(0.5 * (0.5 + 2 + 0 - 2)).epsilon(1e-15));
}

TEST_CASE("verify_attention reference: two identical keys average their values") {
  Tiny t(4, 4, 1, 1, 16, {2}, {1});  // prefix 1 + the node itself
  t.sm_scale = 0.25;
  const float q[4] = {1, 1, 0, 0}, k[4] = {2, 1, 0, 0};
  std::copy(q, q + 4, t.q_at(0, 0));
  std::copy(k, k + 4, t.k_at(0, 0));
  std::copy(k, k + 4, t.k_at(0, 1));
  const float v0[4] = {1, 2, 3, 4}, v1[4] = {3, 2, 1, 0};
  std::copy(v0, v0 + 4, t.v_at(0, 0));
  std::copy(v1, v1 + 4, t.v_at(0, 1));
  t.see(0, 0, 0);
  const auto r = kdtree::ref::verify_attention(t.inputs());
  for (int d = 0; d < 4; ++d) CHECK(out_row(r, t.spec, 0)[d] == doctest::Approx(2.0).epsilon(1e-15));
  CHECK(r.lse[0] == doctest::Approx(0.25 * 3 + std::log(2.0)).epsilon(1e-15));
}

TEST_CASE("verify_attention reference: the mask hides siblings") {
  // prefix 2; tree: 0 root, 1 and 2 children of 0, 3 child of 1.
  Tiny t(4, 4, 1, 1, 16, {6}, {4});
  const int parents[4] = {-1, 0, 0, 1};
  for (int i = 0; i < 4; ++i)
    for (int j = i; j >= 0; j = parents[j]) t.see(0, i, j);
  // q = 0: every visible token weighs the same, out = mean of the visible v.
  for (int tok = 0; tok < 6; ++tok) {
    const float v[4] = {float(tok), float(10 * tok), float(-tok), 1};
    std::copy(v, v + 4, t.v_at(0, tok));
  }
  auto mean_of = [](std::vector<int> tokens) {
    std::vector<double> m(4, 0.0);
    for (int tok : tokens) {
      m[0] += tok;
      m[1] += 10.0 * tok;
      m[2] += -tok;
      m[3] += 1;
    }
    for (double& x : m) x /= double(tokens.size());
    return m;
  };
  auto r = kdtree::ref::verify_attention(t.inputs());
  const std::vector<std::vector<int>> visible = {{0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2, 4}, {0, 1, 2, 3, 5}};
  for (int i = 0; i < 4; ++i) {
    INFO("node " << i);
    const auto m = mean_of(visible[i]);
    for (int d = 0; d < 4; ++d) CHECK(out_row(r, t.spec, i)[d] == doctest::Approx(m[d]).epsilon(1e-14));
    CHECK(r.lse[i] == doctest::Approx(std::log(double(visible[i].size()))).epsilon(1e-14));
  }
  // Change the V of node 1 (token 3): node 2, its sibling, must not move; nodes 1 and 3 must.
  const auto before = r.out;
  t.v_at(0, 3)[0] = 64.0f;
  r = kdtree::ref::verify_attention(t.inputs());
  for (int d = 0; d < 4; ++d) {
    CHECK(out_row(r, t.spec, 0)[d] == before[0 * 4 + d]);
    CHECK(out_row(r, t.spec, 2)[d] == before[2 * 4 + d]);
  }
  CHECK(out_row(r, t.spec, 1)[0] != before[1 * 4 + 0]);
  CHECK(out_row(r, t.spec, 3)[0] != before[3 * 4 + 0]);
}

TEST_CASE("verify_attention reference: the prefix is always visible") {
  // kv_len 5 with 2 nodes: tokens 0..2 are the prefix. Node 1's mask is empty
  // (malformed on purpose): it still sees the prefix, and only the prefix.
  Tiny t(4, 4, 1, 1, 16, {5}, {2});
  t.see(0, 0, 0);
  for (int tok = 0; tok < 5; ++tok) t.v_at(0, tok)[0] = float(1 << tok);
  const auto r = kdtree::ref::verify_attention(t.inputs());
  CHECK(out_row(r, t.spec, 0)[0] == doctest::Approx((1 + 2 + 4 + 8) / 4.0).epsilon(1e-15));
  CHECK(out_row(r, t.spec, 1)[0] == doctest::Approx((1 + 2 + 4) / 3.0).epsilon(1e-15));
  // A prefix token that dominates the scores dominates the output, whatever the mask.
  Tiny u(4, 4, 1, 1, 64, {3}, {1});
  u.q_at(0, 0)[0] = 1;
  u.k_at(0, 0)[0] = 16;  // prefix token 0: score 16; others 0
  u.v_at(0, 0)[1] = 1;
  u.see(0, 0, 0);
  const auto s = kdtree::ref::verify_attention(u.inputs());
  const double p0 = std::exp(16.0) / (std::exp(16.0) + 2.0);
  CHECK(out_row(s, u.spec, 0)[1] == doctest::Approx(p0).epsilon(1e-14));
}

TEST_CASE("verify_attention reference: lse by hand") {
  Tiny t(4, 4, 1, 1, 16, {3}, {1});  // prefix 2, node 0
  t.sm_scale = 0.5;
  t.q_at(0, 0)[0] = 1;
  t.q_at(0, 0)[2] = 2;
  const float k0[4] = {1, 0, 0, 0}, k1[4] = {2, 0, 0, 0}, k2[4] = {-1, 0, 0.5f, 0};  // q.k = 1, 2, 0
  std::copy(k0, k0 + 4, t.k_at(0, 0));
  std::copy(k1, k1 + 4, t.k_at(0, 1));
  std::copy(k2, k2 + 4, t.k_at(0, 2));
  for (int tok = 0; tok < 3; ++tok) t.v_at(0, tok)[tok] = 1;  // v_t = e_t
  t.see(0, 0, 0);
  const auto r = kdtree::ref::verify_attention(t.inputs());
  const double e0 = std::exp(0.5), e1 = std::exp(1.0), e2 = std::exp(0.0), sum = e0 + e1 + e2;
  CHECK(r.lse[0] == doctest::Approx(std::log(sum)).epsilon(1e-15));
  CHECK(out_row(r, t.spec, 0)[0] == doctest::Approx(e0 / sum).epsilon(1e-15));
  CHECK(out_row(r, t.spec, 0)[1] == doctest::Approx(e1 / sum).epsilon(1e-15));
  CHECK(out_row(r, t.spec, 0)[2] == doctest::Approx(e2 / sum).epsilon(1e-15));
  CHECK(out_row(r, t.spec, 0)[3] == 0.0);
}

TEST_CASE("verify_attention reference: MLA takes V from the first head_dim_v dims of the K row") {
  Tiny t(8, 4, 2, 1, 16, {2}, {1}, /*mla=*/true);
  const float k0[8] = {1, 2, 3, 4, 100, 100, 100, 100}, k1[8] = {-1, 0.5f, 0, 8, -100, 0, 0, 0};
  std::copy(k0, k0 + 8, t.k_at(0, 0));
  std::copy(k1, k1 + 8, t.k_at(0, 1));
  t.see(0, 0, 0);
  // head 0: q = 0 -> mean of the two rows' first 4 dims; head 1: q picks dim 5.
  t.q_at(0, 0, 1)[4] = 0.0625f;  // scores 6.25 and -6.25
  const auto r = kdtree::ref::verify_attention(t.inputs());
  for (int d = 0; d < 4; ++d) CHECK(out_row(r, t.spec, 0, 0)[d] == doctest::Approx((k0[d] + k1[d]) / 2).epsilon(1e-15));
  const double p = std::exp(6.25) / (std::exp(6.25) + std::exp(-6.25));
  for (int d = 0; d < 4; ++d)
    CHECK(out_row(r, t.spec, 0, 1)[d] == doctest::Approx(p * k0[d] + (1 - p) * k1[d]).epsilon(1e-14));
}

TEST_CASE("verify_attention reference: GQA maps q head h to kv head h / group (group 4)") {
  Tiny t(4, 4, 8, 2, 16, {2}, {1});  // 8 q heads, 2 kv heads
  t.see(0, 0, 0);
  for (int kvh = 0; kvh < 2; ++kvh) {
    // kv head 0 favours token 0, kv head 1 favours token 1.
    t.k_at(0, kvh, kvh)[0] = 2;
    for (int tok = 0; tok < 2; ++tok) t.v_at(0, tok, kvh)[0] = float(10 * kvh + tok);
  }
  for (int h = 0; h < 8; ++h) t.q_at(0, 0, h)[0] = 1;
  const auto r = kdtree::ref::verify_attention(t.inputs());
  const double p = std::exp(2.0) / (std::exp(2.0) + 1.0);
  for (int h = 0; h < 8; ++h) {
    INFO("q head " << h);
    const double expect = h < 4 ? p * 0 + (1 - p) * 1 : 10 + (1 - p) * 0 + p * 1;
    CHECK(out_row(r, t.spec, 0, h)[0] == doctest::Approx(expect).epsilon(1e-14));
  }
}

TEST_CASE("verify_attention reference: requests are independent") {
  // Two requests: the second one's output must not depend on the first's KV.
  Tiny t(4, 4, 1, 1, 16, {3, 2}, {2, 1});
  t.see(0, 0, 0);
  t.see(0, 1, 0);
  t.see(0, 1, 1);
  t.see(1, 0, 0);
  for (int tok = 0; tok < 2; ++tok) t.v_at(1, tok)[0] = float(tok + 1);
  auto r = kdtree::ref::verify_attention(t.inputs());
  CHECK(out_row(r, t.spec, 2)[0] == doctest::Approx(1.5).epsilon(1e-15));
  t.v_at(0, 0)[0] = 7;
  r = kdtree::ref::verify_attention(t.inputs());
  CHECK(out_row(r, t.spec, 2)[0] == doctest::Approx(1.5).epsilon(1e-15));
  CHECK(out_row(r, t.spec, 0)[0] == doctest::Approx(3.5).epsilon(1e-15));
}

TEST_CASE("verify_attention reference: malformed input throws") {
  const auto spec = make_verify_spec(16, 16, 2, 1, 4, 16, KDTREE_DTYPE_BF16);
  VerifyCase c = kdtree::ref::build_verify_case(spec, 2, 7);
  CHECK_NOTHROW(kdtree::ref::verify_attention(c.host_inputs()));
  VerifyCase bad_page = c;
  bad_page.page_table[0] = c.num_pages;
  CHECK_THROWS_AS(kdtree::ref::verify_attention(bad_page.host_inputs()), std::invalid_argument);
  VerifyCase bad_len = c;
  bad_len.kv_lens[1] = c.node_counts[1] - 1;
  CHECK_THROWS_AS(kdtree::ref::verify_attention(bad_len.host_inputs()), std::invalid_argument);
  VerifyCase bad_count = c;
  bad_count.spec.max_tree_nodes = c.node_counts[0] - 1;
  CHECK_THROWS_AS(kdtree::ref::verify_attention(bad_count.host_inputs()), std::invalid_argument);
}

TEST_CASE("verify_attention reference: agrees with a dense formulation on random cases") {
  struct Shape {
    int dqk, dv, hq, hkv, page, W;
    kdtree_dtype dtype;
  };
  const Shape shapes[] = {
      {40, 32, 4, 1, 16, 16, KDTREE_DTYPE_BF16},  // MLA-like: V inside the K row
      {16, 16, 8, 2, 1, 32, KDTREE_DTYPE_F16},
      {32, 32, 3, 3, 64, 64, KDTREE_DTYPE_BF16},
      {8, 8, 4, 1, 16, 128, KDTREE_DTYPE_F16},  // two mask words
  };
  uint64_t seed = 100;
  for (const Shape& sh : shapes) {
    kdtree::ref::VerifyCaseOptions o;
    o.max_prefix = 150;
    o.q_scale = 2.0f;
    const VerifyCase c = kdtree::ref::build_verify_case(
        make_verify_spec(sh.dqk, sh.dv, sh.hq, sh.hkv, sh.page, sh.W, sh.dtype), 4, seed++, o);
    INFO(c.label());
    const auto r = kdtree::ref::verify_attention(c.host_inputs());
    const auto d = dense_attention(c);
    double worst = 0, worst_lse = 0;
    for (size_t e = 0; e < r.out.size(); ++e) worst = std::max(worst, std::fabs(r.out[e] - d.out[e]));
    for (size_t e = 0; e < r.lse.size(); ++e) worst_lse = std::max(worst_lse, std::fabs(r.lse[e] - d.lse[e]));
    CHECK(worst < 1e-12);
    CHECK(worst_lse < 1e-12);
    // Thread count does not change a bit.
    const auto r1 = kdtree::ref::verify_attention(c.host_inputs(), 1);
    CHECK(r1.out == r.out);
    CHECK(r1.lse == r.lse);
  }
}

TEST_CASE("verify_attention reference: the physical page layout does not matter") {
  const auto spec = make_verify_spec(32, 32, 4, 2, 16, 32, KDTREE_DTYPE_BF16);
  const VerifyCase c = kdtree::ref::build_verify_case(spec, 3, 11);
  // Move physical page p to num_pages - 1 - p.
  VerifyCase m = c;
  const size_t page_elems = size_t(spec.page_size) * spec.num_kv_heads * spec.head_dim_qk;
  for (int p = 0; p < c.num_pages; ++p) {
    const int to = c.num_pages - 1 - p;
    std::copy(c.k_cache.begin() + p * page_elems, c.k_cache.begin() + (p + 1) * page_elems,
              m.k_cache.begin() + to * page_elems);
    std::copy(c.v_cache.begin() + p * page_elems, c.v_cache.begin() + (p + 1) * page_elems,
              m.v_cache.begin() + to * page_elems);
  }
  for (int32_t& e : m.page_table)
    if (e >= 0) e = c.num_pages - 1 - e;
  const auto a = kdtree::ref::verify_attention(c.host_inputs());
  const auto b = kdtree::ref::verify_attention(m.host_inputs());
  CHECK(a.out == b.out);
  CHECK(a.lse == b.lse);
}

TEST_CASE("verify_case: random trees - lengths and pages hold their invariants") {
  const int widths[] = {16, 32, 64, 128};
  const int pages[] = {1, 16, 64};
  uint64_t seed = 1;
  for (int W : widths) {
    for (int P : pages) {
      const bool mla = (W + P) % 2 == 0;
      const auto spec = mla ? make_verify_spec(576, 512, 4, 1, P, W, KDTREE_DTYPE_BF16)
                            : make_verify_spec(64, 64, 4, 2, P, W, KDTREE_DTYPE_F16);
      kdtree::ref::VerifyCaseOptions o;
      o.max_prefix = 300;
      const int B = 5;
      const VerifyCase c = kdtree::ref::build_verify_case(spec, B, seed++, o);
      INFO(c.label());
      CHECK(c.mla == mla);
      CHECK(c.node_indptr.front() == 0);
      CHECK(c.node_indptr.back() == c.total_nodes);
      CHECK(c.node_counts[0] == W);  // extremes
      CHECK(c.node_counts[B - 1] == 1);
      CHECK(c.prefix_lens[0] == 300);
      CHECK(c.prefix_lens[1] == 0);
      CHECK(c.sm_scale == doctest::Approx(1.0 / std::sqrt(double(spec.head_dim_qk))));
      CHECK(c.q.size() == size_t(c.total_nodes) * spec.num_q_heads * spec.head_dim_qk);
      CHECK(c.k_cache.size() == size_t(c.num_pages) * P * spec.num_kv_heads * spec.head_dim_qk);
      CHECK(c.v_cache.size() == (mla ? 0 : c.k_cache.size()));
      std::set<int> used;
      int needed = 0;
      for (int b = 0; b < B; ++b) {
        const int n = c.node_indptr[b + 1] - c.node_indptr[b];
        CHECK(n == c.node_counts[b]);
        CHECK(n >= 1);
        CHECK(n <= W);
        CHECK(c.kv_lens[b] == c.prefix_lens[b] + n);
        CHECK(c.kv_lens[b] <= c.max_kv_len);
        const int np = (c.kv_lens[b] + P - 1) / P;
        needed += np;
        for (int p = 0; p < c.max_pages_per_req; ++p) {
          const int e = c.page_table[size_t(b) * c.max_pages_per_req + p];
          if (p < np) {
            CHECK(e >= 0);
            CHECK(e < c.num_pages);
            CHECK(used.insert(e).second);  // no physical page is shared
          } else {
            CHECK(e == -1);
          }
        }
        // Masks: exactly the node and its ancestors.
        for (int i = 0; i < n; ++i) {
          const int node = c.node_indptr[b] + i;
          const int parent = c.parents[node];
          CHECK(parent < i);
          CHECK((i == 0) == (parent == -1));
          std::vector<uint64_t> expect(c.mask_words, 0);
          for (int j = i; j >= 0; j = c.parents[c.node_indptr[b] + j]) expect[j / 64] |= uint64_t(1) << (j % 64);
          for (int w = 0; w < c.mask_words; ++w) CHECK(c.tree_mask[size_t(node) * c.mask_words + w] == expect[w]);
        }
      }
      CHECK(c.num_pages > needed);
      // Rows no request reads are NaN.
      size_t nan_rows = 0;
      for (size_t r = 0; r < c.k_cache.size() / spec.head_dim_qk; ++r)
        nan_rows += std::isnan(from_half(c.k_cache[r * spec.head_dim_qk], spec.dtype));
      size_t used_rows = 0;
      for (int b = 0; b < B; ++b) used_rows += size_t(c.kv_lens[b]) * spec.num_kv_heads;
      CHECK(nan_rows == c.k_cache.size() / spec.head_dim_qk - used_rows);
    }
  }
  // The same seed gives the same case; another seed does not.
  const auto spec = make_verify_spec(128, 128, 8, 2, 16, 64, KDTREE_DTYPE_BF16);
  const VerifyCase a = kdtree::ref::build_verify_case(spec, 3, 42), b = kdtree::ref::build_verify_case(spec, 3, 42),
                   d = kdtree::ref::build_verify_case(spec, 3, 43);
  CHECK(a.q == b.q);
  CHECK(a.k_cache == b.k_cache);
  CHECK(a.tree_mask == b.tree_mask);
  CHECK(a.page_table == b.page_table);
  CHECK(a.q != d.q);
  CHECK(a.label("splits=3") == "verify_attention[gqa128,W=64,page=16,bf16,Hq=8,Hkv=2,B=3,splits=3]");
}

TEST_CASE("verify_case: compare_verify measures rounding - catches NaN and lse errors") {
  const auto spec = make_verify_spec(576, 512, 8, 1, 64, 64, KDTREE_DTYPE_BF16);
  kdtree::ref::VerifyCaseOptions o;
  o.max_prefix = 200;
  const VerifyCase c = kdtree::ref::build_verify_case(spec, 3, 5, o);
  CHECK(c.label() == "verify_attention[mla576/512,W=64,page=64,bf16,Hq=8,B=3]");
  const auto ref = kdtree::ref::verify_attention(c.host_inputs());
  std::vector<uint16_t> out(c.out_elems());
  for (size_t e = 0; e < out.size(); ++e) out[e] = to_half(float(ref.out[e]), spec.dtype);
  std::vector<float> lse(ref.lse.begin(), ref.lse.end());
  auto cmp = kdtree::ref::compare_verify(c, ref, out, lse.data());
  INFO(cmp.summary());
  CHECK(cmp.ok(1e-2, 1e-2));
  CHECK(cmp.worst_rel < 1.0 / 256);  // bf16 rounding only
  CHECK(cmp.worst_rel > 0);
  CHECK(cmp.max_lse_abs < 1e-5);
  CHECK(cmp.rel_err.size() == 3);
  // An unwritten (poisoned) element in request 1.
  std::vector<uint16_t> poisoned = out;
  poisoned[size_t(c.node_indptr[1]) * 8 * 512 + 3] = 0xFFFF;
  cmp = kdtree::ref::compare_verify(c, ref, poisoned, lse.data());
  CHECK(cmp.nan_out == 1);
  CHECK(cmp.worst_request == 1);
  CHECK(!cmp.ok(1e-2, 1e-2));
  // A wrong lse.
  lse[4] += 0.05f;
  cmp = kdtree::ref::compare_verify(c, ref, out, lse.data());
  CHECK(cmp.max_lse_abs == doctest::Approx(0.05).epsilon(1e-3));
  CHECK(!cmp.ok(1e-2, 1e-2));
  // A request whose output is all NaN.
  std::vector<uint16_t> nan_req = out;
  for (size_t e = size_t(c.node_indptr[2]) * 8 * 512; e < size_t(c.node_indptr[3]) * 8 * 512; ++e) nan_req[e] = 0x7fc0;
  CHECK(kdtree::ref::request_all_nan(c, 2, nan_req));
  CHECK(!kdtree::ref::request_all_nan(c, 1, nan_req));
}

TEST_CASE("verify_case: k_ramp moves the row max by more than 2^8 after the first tile") {
  // The GPU parity grid relies on this to reach the kernels' lazy-rescale path: the
  // reference max (log2 units) only moves when the row max passes it by more than 8.
  const auto spec = make_verify_spec(576, 512, 8, 1, 64, 16, KDTREE_DTYPE_BF16);
  kdtree::ref::VerifyCaseOptions o;
  o.prefix_lens = {1000};
  o.q_scale = 4.0f;
  o.k_ramp = 3.0f;
  const VerifyCase c = kdtree::ref::build_verify_case(spec, 1, 7, o);
  const int P = spec.page_size, d = spec.head_dim_qk;
  for (int h = 0; h < spec.num_q_heads; ++h) {
    double first_tile = -INFINITY, all = -INFINITY;
    for (int t = 0; t < c.kv_lens[0]; ++t) {
      const size_t row = size_t(c.page_table[t / P]) * P + t % P;
      double dot = 0.0;
      for (int i = 0; i < d; ++i)
        dot += double(from_half(c.q[size_t(h) * d + i], spec.dtype)) * from_half(c.k_cache[row * d + i], spec.dtype);
      const double score_log2 = dot * c.sm_scale / std::log(2.0);
      if (t < 64) first_tile = std::max(first_tile, score_log2);
      all = std::max(all, score_log2);
    }
    INFO("head " << h << ": first tile max " << first_tile << ", overall max " << all);
    CHECK(all - first_tile > 8.0);
  }
}
