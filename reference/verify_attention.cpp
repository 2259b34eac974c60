#include "reference/verify_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

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

void validate(const VerifyHostInputs& in) {
  const kdtree_verify_spec& s = in.spec;
  check(s.dtype == KDTREE_DTYPE_BF16 || s.dtype == KDTREE_DTYPE_F16, "dtype must be bf16 or f16");
  check(s.head_dim_qk > 0 && s.head_dim_v > 0, "head dims must be positive");
  check(s.num_q_heads > 0 && s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0,
        "num_q_heads must be a positive multiple of num_kv_heads");
  check(s.page_size > 0 && s.max_tree_nodes > 0, "page_size and max_tree_nodes must be positive");
  check(in.v_cache != nullptr || s.head_dim_v <= s.head_dim_qk, "MLA needs head_dim_v <= head_dim_qk");
  check(in.batch_size > 0 && in.num_pages > 0 && in.max_pages_per_req > 0, "sizes must be positive");
  check(in.q && in.node_indptr && in.k_cache && in.page_table && in.kv_lens && in.tree_mask,
        "an input pointer is NULL");
  check(in.node_indptr[0] == 0 && in.node_indptr[in.batch_size] == in.total_nodes,
        "node_indptr must start at 0 and end at total_nodes");
  for (int b = 0; b < in.batch_size; ++b) {
    const int n = in.node_indptr[b + 1] - in.node_indptr[b];
    const int kv_len = in.kv_lens[b];
    check(n >= 1 && n <= s.max_tree_nodes, "request " + std::to_string(b) + ": node count " +
                                               std::to_string(n) + " outside 1..max_tree_nodes");
    check(kv_len >= n, "request " + std::to_string(b) + ": kv_len smaller than its node count");
    const int pages = (kv_len + s.page_size - 1) / s.page_size;
    check(pages <= in.max_pages_per_req, "request " + std::to_string(b) + ": kv_len needs more pages than max_pages_per_req");
    for (int p = 0; p < pages; ++p) {
      const int page = in.page_table[size_t(b) * in.max_pages_per_req + p];
      check(page >= 0 && page < in.num_pages, "request " + std::to_string(b) + ": page id " +
                                                  std::to_string(page) + " out of range");
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
  const bool mla = in.v_cache == nullptr;

  const size_t cache_rows = size_t(in.num_pages) * page_size * hkv;
  const std::vector<float> q = decode(in.q, size_t(in.total_nodes) * hq * dqk, s.dtype);
  const std::vector<float> k = decode(in.k_cache, cache_rows * dqk, s.dtype);
  const std::vector<float> v = mla ? std::vector<float>() : decode(in.v_cache, cache_rows * dv, s.dtype);

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

  std::vector<int> request_of(in.total_nodes);
  for (int b = 0; b < in.batch_size; ++b)
    for (int node = in.node_indptr[b]; node < in.node_indptr[b + 1]; ++node) request_of[node] = b;

  // One output row: (node, head).
  auto compute_row = [&](int node, int h) {
    const int b = request_of[node];
    const int n = in.node_indptr[b + 1] - in.node_indptr[b];
    const int kv_len = in.kv_lens[b];
    const int prefix = kv_len - n;
    const uint64_t* mask = in.tree_mask + size_t(node) * mask_words;
    const int kvh = h / group;
    const float* qrow = &q[(size_t(node) * hq + h) * dqk];

    std::vector<int> tokens;
    std::vector<double> scores;
    for (int t = 0; t < kv_len; ++t) {
      const bool visible = t < prefix || ((mask[(t - prefix) / 64] >> ((t - prefix) % 64)) & 1u);
      if (!visible) continue;
      const float* krow = k_row(cache_row(b, t, kvh));
      double dot = 0.0;
      for (int d = 0; d < dqk; ++d) dot += double(qrow[d]) * double(krow[d]);
      tokens.push_back(t);
      scores.push_back(in.sm_scale * dot);
    }

    double* out = &result.out[(size_t(node) * hq + h) * dv];
    double& lse = result.lse[size_t(node) * hq + h];
    if (tokens.empty()) {  // cannot happen for a well-formed tree (a node sees itself)
      lse = -std::numeric_limits<double>::infinity();
      return;
    }
    const double max_score = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (double& sc : scores) {
      sc = std::exp(sc - max_score);
      sum += sc;
    }
    for (size_t j = 0; j < tokens.size(); ++j) {
      const double p = scores[j] / sum;
      const float* vrow = v_row(cache_row(b, tokens[j], kvh));
      for (int d = 0; d < dv; ++d) out[d] += p * double(vrow[d]);
    }
    lse = max_score + std::log(sum);
  };

  const long rows = long(in.total_nodes) * hq;
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  threads = int(std::min<long>(threads, rows));
  std::atomic<long> next{0};
  auto worker = [&] {
    for (long r = next++; r < rows; r = next++) compute_row(int(r / hq), int(r % hq));
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return result;
}

}  // namespace kdtree::ref
