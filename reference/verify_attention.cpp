#include "reference/verify_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "reference/fp8.hpp"
#include "reference/half.hpp"

namespace kdtree::ref {
namespace {

void check(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("verify_attention reference: " + message);
}

// 16-bit storage decoded once to float (exact for bf16 and f16).
std::vector<float> decode(const uint16_t* data, size_t count, int dtype) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = from_half(data[i], dtype);
  return values;
}

// e4m3 codes decoded to float (exact); the scale is applied in float64 later.
std::vector<float> decode8(const uint8_t* data, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = e4m3_to_float(data[i]);
  return values;
}

// q . k in float64, with four partial sums (independent add chains run ~4x faster).
double dot(const float* a, const float* b, int n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int d = 0;
  for (; d + 4 <= n; d += 4)
    for (int u = 0; u < 4; ++u) s[u] += double(a[d + u]) * double(b[d + u]);
  for (; d < n; ++d) s[0] += double(a[d]) * double(b[d]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// sum |a_i b_i| in float64, in order.
double abs_dot(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int d = 0; d < n; ++d) s += std::fabs(double(a[d]) * double(b[d]));
  return s;
}

void validate(const VerifyHostInputs& in) {
  const kdtree_verify_spec& s = in.spec;
  check(s.dtype == KDTREE_DTYPE_BF16 || s.dtype == KDTREE_DTYPE_F16, "dtype must be bf16 or f16");
  check(s.head_dim_qk > 0 && s.head_dim_v > 0, "head dims must be positive");
  check(s.num_q_heads > 0 && s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0,
        "num_q_heads must be a positive multiple of num_kv_heads");
  check(s.page_size > 0 && s.max_tree_nodes > 0, "page_size and max_tree_nodes must be positive");
  const bool fp8 = s.kv_dtype == KDTREE_KV_DTYPE_E4M3;
  check(fp8 || s.kv_dtype == KDTREE_KV_DTYPE_AS_Q, "kv_dtype must be as_q or e4m3");
  check((fp8 ? in.v_cache8 != nullptr : in.v_cache != nullptr) || s.head_dim_v <= s.head_dim_qk,
        "MLA needs head_dim_v <= head_dim_qk");
  check(!fp8 || (std::isfinite(in.k_scale) && in.k_scale > 0 && std::isfinite(in.v_scale) && in.v_scale > 0),
        "e4m3 scales must be positive and finite");
  check(in.batch_size > 0 && in.num_pages > 0 && in.max_pages_per_req > 0, "sizes must be positive");
  check(in.q && in.node_indptr && (fp8 ? in.k_cache8 != nullptr : in.k_cache != nullptr) && in.page_table &&
            in.kv_lens && in.tree_mask,
        "an input pointer is NULL");
  check(in.node_indptr[0] == 0 && in.node_indptr[in.batch_size] == in.total_nodes,
        "node_indptr must start at 0 and end at total_nodes");
  for (int b = 0; b < in.batch_size; ++b) {
    const int n = in.node_indptr[b + 1] - in.node_indptr[b];
    const int kv_len = in.kv_lens[b];
    check(n >= 1 && n <= s.max_tree_nodes,
          "request " + std::to_string(b) + ": node count " + std::to_string(n) + " outside 1..max_tree_nodes");
    check(kv_len >= n, "request " + std::to_string(b) + ": kv_len smaller than its node count");
    const int pages = (kv_len + s.page_size - 1) / s.page_size;
    check(pages <= in.max_pages_per_req,
          "request " + std::to_string(b) + ": kv_len needs more pages than max_pages_per_req");
    for (int p = 0; p < pages; ++p) {
      const int page = in.page_table[size_t(b) * in.max_pages_per_req + p];
      check(page >= 0 && page < in.num_pages,
            "request " + std::to_string(b) + ": page id " + std::to_string(page) + " out of range");
    }
  }
}

}  // namespace

VerifyReference verify_attention(const VerifyHostInputs& in, int threads) {
  validate(in);
  const kdtree_verify_spec& s = in.spec;
  const int hq = s.num_q_heads, hkv = s.num_kv_heads, group = hq / hkv;
  const int dqk = s.head_dim_qk, dv = s.head_dim_v, page_size = s.page_size;
  const int mask_words = (s.max_tree_nodes + 63) / 64;
  const bool fp8 = s.kv_dtype == KDTREE_KV_DTYPE_E4M3;
  const bool mla = fp8 ? in.v_cache8 == nullptr : in.v_cache == nullptr;

  const size_t cache_rows = size_t(in.num_pages) * page_size * hkv;
  const std::vector<float> q = decode(in.q, size_t(in.total_nodes) * hq * dqk, s.dtype);
  // Unscaled cache values; k_scale multiplies the scores and v_scale the output
  // in float64, which equals scaling every element (exact arithmetic aside from
  // the final rounding of each double operation).
  const std::vector<float> k =
      fp8 ? decode8(in.k_cache8, cache_rows * dqk) : decode(in.k_cache, cache_rows * dqk, s.dtype);
  const std::vector<float> v = mla   ? std::vector<float>()
                               : fp8 ? decode8(in.v_cache8, cache_rows * dv)
                                     : decode(in.v_cache, cache_rows * dv, s.dtype);
  const double k_scale = fp8 ? in.k_scale : 1.0, v_scale = fp8 ? in.v_scale : 1.0;

  // The cache row of logical token t of request b, KV head kvh, through the page table.
  auto cache_row = [&](int b, int t, int kvh) -> size_t {
    const int page = in.page_table[size_t(b) * in.max_pages_per_req + t / page_size];
    return (size_t(page) * page_size + t % page_size) * hkv + kvh;
  };
  auto k_row = [&](size_t row) { return &k[row * dqk]; };
  auto v_row = [&](size_t row) { return mla ? &k[row * dqk] : &v[row * dv]; };  // MLA: V = K[0:Dv]

  VerifyReference result;
  result.out.assign(size_t(in.total_nodes) * hq * dv, 0.0);
  result.lse.assign(size_t(in.total_nodes) * hq, 0.0);
  if (fp8) result.score_abs_bound.assign(size_t(in.total_nodes) * hq, 0.0);

  std::vector<int> request_of(in.total_nodes);
  for (int b = 0; b < in.batch_size; ++b)
    for (int node = in.node_indptr[b]; node < in.node_indptr[b + 1]; ++node) request_of[node] = b;

  // One task: a node and a KV head, i.e. the `group` query heads that share
  // that KV head (each K/V row is then read once for all of them).
  auto compute = [&](int node, int kvh) {
    const int b = request_of[node];
    const int n = in.node_indptr[b + 1] - in.node_indptr[b];
    const int kv_len = in.kv_lens[b];
    const int prefix = kv_len - n;
    const uint64_t* mask = in.tree_mask + size_t(node) * mask_words;

    std::vector<size_t> rows;  // cache rows of the visible tokens
    for (int t = 0; t < kv_len; ++t) {
      const bool visible = t < prefix || ((mask[(t - prefix) / 64] >> ((t - prefix) % 64)) & 1u);
      if (visible) rows.push_back(cache_row(b, t, kvh));
    }
    const int h0 = kvh * group;
    if (rows.empty()) {  // cannot happen for a well-formed tree (a node sees itself)
      for (int h = h0; h < h0 + group; ++h)
        result.lse[size_t(node) * hq + h] = -std::numeric_limits<double>::infinity();
      return;
    }
    // scores[g][j]: query head h0 + g against visible token j. Token-outer loops
    // keep each K/V row in cache while the group's heads use it.
    // e4m3 caches: bound[g], the largest sum |q_i k_i| over the visible tokens, in the same pass.
    std::vector<std::vector<double>> scores(group, std::vector<double>(rows.size()));
    std::vector<double> bound(fp8 ? group : 0, 0.0);
    for (size_t j = 0; j < rows.size(); ++j) {
      for (int g = 0; g < group; ++g) {
        const float* qrow = &q[(size_t(node) * hq + h0 + g) * dqk];
        scores[g][j] = in.sm_scale * k_scale * dot(qrow, k_row(rows[j]), dqk);
        if (fp8) bound[g] = std::max(bound[g], abs_dot(qrow, k_row(rows[j]), dqk));
      }
    }
    for (int g = 0; g < int(bound.size()); ++g)
      result.score_abs_bound[size_t(node) * hq + h0 + g] = in.sm_scale * k_scale * bound[g];
    // Softmax per head: scores become probabilities.
    for (int g = 0; g < group; ++g) {
      const double max_score = *std::max_element(scores[g].begin(), scores[g].end());
      double sum = 0.0;
      for (double& sc : scores[g]) {
        sc = std::exp(sc - max_score);
        sum += sc;
      }
      for (double& sc : scores[g]) sc /= sum;
      result.lse[size_t(node) * hq + h0 + g] = max_score + std::log(sum);
    }
    for (size_t j = 0; j < rows.size(); ++j) {
      const float* vrow = v_row(rows[j]);
      for (int g = 0; g < group; ++g) {
        double* out = &result.out[(size_t(node) * hq + h0 + g) * dv];
        const double p = scores[g][j] * v_scale;
        for (int d = 0; d < dv; ++d) out[d] += p * double(vrow[d]);
      }
    }
  };

  const long tasks = long(in.total_nodes) * hkv;
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  threads = int(std::min<long>(threads, tasks));
  std::atomic<long> next{0};
  auto worker = [&] {
    for (long task = next++; task < tasks; task = next++) compute(int(task / hkv), int(task % hkv));
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return result;
}

}  // namespace kdtree::ref
