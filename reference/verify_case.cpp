#include "reference/verify_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>

#include "reference/fp8.hpp"
#include "reference/half.hpp"

namespace kdtree::ref {
namespace {

int uniform_int(std::mt19937_64& rng, int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

uint16_t nan_bits(int dtype) { return dtype == KDTREE_DTYPE_BF16 ? 0x7fc0 : 0x7e00; }

struct ValueSource {
  std::mt19937_64& rng;
  ValueDist dist;
  int dtype;
  std::uniform_real_distribution<float> uniform{-1.0f, 1.0f};
  std::normal_distribution<float> normal{0.0f, 1.0f};
  uint16_t next(float scale = 1.0f) {
    const float x = dist == ValueDist::uniform ? uniform(rng) : normal(rng);
    return to_half(x * scale, dtype);
  }
};

std::string fmt_double(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

// e4m3 caches: the 16-bit values just drawn, divided by the scale and encoded
// (round to nearest even, saturating); unused rows keep their fill (NaN: 0x7f).
// Drawing everything as 16-bit first keeps one value stream for both cache types.
void to_e4m3(VerifyCase& c, const VerifyCaseOptions& o, std::mt19937_64& rng) {
  auto draw_scale = [&] {
    const int e = uniform_int(rng, -8, -3), m = uniform_int(rng, 0, 7);
    return std::ldexp(1.0f + float(m) / 8.0f, e);
  };
  c.k_scale = o.k_scale > 0 ? o.k_scale : draw_scale();
  c.v_scale = o.v_scale > 0 ? o.v_scale : draw_scale();
  // MLA encodes its one row with k_scale; V reads the same codes x v_scale.
  auto encode = [&](const std::vector<uint16_t>& from, float scale) {
    std::vector<uint8_t> to(from.size());
    for (size_t i = 0; i < from.size(); ++i) {
      const float x = from_half(from[i], c.spec.dtype);
      to[i] = std::isnan(x) ? kE4m3Nan : float_to_e4m3(x / scale);
    }
    return to;
  };
  c.k_cache8 = encode(c.k_cache, c.k_scale);
  c.v_cache8 = encode(c.v_cache, c.v_scale);
  c.k_cache.clear();
  c.v_cache.clear();
}

}  // namespace

std::string VerifyCase::head_name() const {
  if (mla) return "mla" + std::to_string(spec.head_dim_qk) + "/" + std::to_string(spec.head_dim_v);
  return "gqa" + std::to_string(spec.head_dim_qk);
}

std::string verify_label(const kdtree_verify_spec& spec, int batch_size, const std::string& extra) {
  const bool mla = spec.head_dim_qk != spec.head_dim_v;
  std::string s = "verify_attention[" +
                  (mla ? "mla" + std::to_string(spec.head_dim_qk) + "/" + std::to_string(spec.head_dim_v)
                       : "gqa" + std::to_string(spec.head_dim_qk)) +
                  ",W=" + std::to_string(spec.max_tree_nodes) + ",page=" + std::to_string(spec.page_size) + "," +
                  (spec.dtype == KDTREE_DTYPE_BF16 ? "bf16" : "f16") +
                  (spec.kv_dtype == KDTREE_KV_DTYPE_E4M3 ? ",kv=e4m3" : "") + ",Hq=" + std::to_string(spec.num_q_heads);
  if (!mla) s += ",Hkv=" + std::to_string(spec.num_kv_heads);
  s += ",B=" + std::to_string(batch_size);
  if (!extra.empty()) s += "," + extra;
  return s + "]";
}

std::string VerifyCase::label(const std::string& extra) const { return verify_label(spec, batch_size, extra); }

VerifyHostInputs VerifyCase::host_inputs() const {
  VerifyHostInputs in;
  in.spec = spec;
  in.batch_size = batch_size;
  in.total_nodes = total_nodes;
  in.num_pages = num_pages;
  in.max_pages_per_req = max_pages_per_req;
  in.q = q.data();
  in.node_indptr = node_indptr.data();
  if (kv_fp8()) {
    in.k_cache8 = k_cache8.data();
    in.v_cache8 = mla ? nullptr : v_cache8.data();
    in.k_scale = k_scale;
    in.v_scale = v_scale;
  } else {
    in.k_cache = k_cache.data();
    in.v_cache = mla ? nullptr : v_cache.data();
  }
  in.page_table = page_table.data();
  in.kv_lens = kv_lens.data();
  in.tree_mask = tree_mask.data();
  in.sm_scale = double(sm_scale);
  return in;
}

VerifyCase build_verify_case(const kdtree_verify_spec& spec, int batch_size, uint64_t seed,
                             const VerifyCaseOptions& o) {
  auto require = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("build_verify_case: ") + what);
  };
  const int W = spec.max_tree_nodes;
  const int max_nodes = o.max_nodes > 0 ? o.max_nodes : W;
  require(batch_size > 0, "batch_size must be positive");
  require(spec.num_q_heads > 0 && spec.num_kv_heads > 0 && spec.num_q_heads % spec.num_kv_heads == 0,
          "num_q_heads must be a positive multiple of num_kv_heads");
  require(spec.page_size > 0 && W > 0 && spec.head_dim_qk > 0 && spec.head_dim_v > 0, "bad spec");
  require(o.min_nodes >= 1 && o.min_nodes <= max_nodes && max_nodes <= W, "need 1 <= min_nodes <= max_nodes <= W");
  require(o.min_prefix >= 0 && o.min_prefix <= o.max_prefix, "need 0 <= min_prefix <= max_prefix");
  require(o.prefix_lens.empty() || int(o.prefix_lens.size()) == batch_size, "prefix_lens needs batch_size entries");
  require(o.node_counts.empty() || int(o.node_counts.size()) == batch_size, "node_counts needs batch_size entries");

  VerifyCase c;
  c.spec = spec;
  c.mla = spec.head_dim_v != spec.head_dim_qk;
  require(!c.mla || (spec.num_kv_heads == 1 && spec.head_dim_v < spec.head_dim_qk),
          "MLA (head_dim_v != head_dim_qk) needs num_kv_heads 1 and head_dim_v < head_dim_qk");
  c.batch_size = batch_size;
  c.seed = seed;
  c.mask_words = (W + 63) / 64;
  c.sm_scale = o.sm_scale > 0 ? o.sm_scale : float(1.0 / std::sqrt(double(spec.head_dim_qk)));
  std::mt19937_64 rng(seed);

  // Tree shapes and lengths.
  c.node_counts.resize(batch_size);
  c.prefix_lens.resize(batch_size);
  for (int b = 0; b < batch_size; ++b) {
    c.node_counts[b] = uniform_int(rng, o.min_nodes, max_nodes);
    c.prefix_lens[b] = uniform_int(rng, o.min_prefix, o.max_prefix);
  }
  if (o.extremes) {
    c.node_counts[0] = max_nodes;
    c.prefix_lens[0] = o.max_prefix;
    if (batch_size >= 2) c.node_counts[batch_size - 1] = o.min_nodes;
    if (batch_size >= 3) c.prefix_lens[1] = o.min_prefix;
  }
  if (!o.node_counts.empty()) c.node_counts = o.node_counts;
  if (!o.prefix_lens.empty()) c.prefix_lens = o.prefix_lens;
  for (int b = 0; b < batch_size; ++b) {
    require(c.node_counts[b] >= 1 && c.node_counts[b] <= W, "node_counts must be in 1..W");
    require(c.prefix_lens[b] >= 0, "prefix_lens must be >= 0");
  }

  c.node_indptr.assign(batch_size + 1, 0);
  c.kv_lens.resize(batch_size);
  for (int b = 0; b < batch_size; ++b) {
    c.node_indptr[b + 1] = c.node_indptr[b] + c.node_counts[b];
    c.kv_lens[b] = c.prefix_lens[b] + c.node_counts[b];
  }
  c.total_nodes = c.node_indptr[batch_size];
  c.max_kv_len = *std::max_element(c.kv_lens.begin(), c.kv_lens.end()) + o.max_kv_len_slack;

  // Random trees: parent of node i (i >= 1) uniform in [0, i); the mask of a
  // node is its parent's mask plus itself.
  c.parents.assign(c.total_nodes, -1);
  c.tree_mask.assign(size_t(c.total_nodes) * c.mask_words, 0);
  for (int b = 0; b < batch_size; ++b) {
    const int base = c.node_indptr[b];
    for (int i = 0; i < c.node_counts[b]; ++i) {
      uint64_t* mask = &c.tree_mask[size_t(base + i) * c.mask_words];
      if (i > 0) {
        const int parent = uniform_int(rng, 0, i - 1);
        c.parents[base + i] = parent;
        const uint64_t* pmask = &c.tree_mask[size_t(base + parent) * c.mask_words];
        std::copy(pmask, pmask + c.mask_words, mask);
      }
      mask[i / 64] |= uint64_t(1) << (i % 64);
    }
  }

  // Pages: each request's logical pages map to distinct physical pages drawn
  // from a permutation that also leaves extra_pages unused.
  const int P = spec.page_size;
  std::vector<int> pages_needed(batch_size);
  int total_pages = 0;
  for (int b = 0; b < batch_size; ++b) {
    pages_needed[b] = (c.kv_lens[b] + P - 1) / P;
    total_pages += pages_needed[b];
  }
  c.num_pages = total_pages + std::max(0, o.extra_pages);
  c.max_pages_per_req = *std::max_element(pages_needed.begin(), pages_needed.end()) + std::max(0, o.table_slack);
  std::vector<int> physical(c.num_pages);
  std::iota(physical.begin(), physical.end(), 0);
  if (o.scatter_pages) std::shuffle(physical.begin(), physical.end(), rng);
  c.page_table.assign(size_t(batch_size) * c.max_pages_per_req, -1);
  int cursor = 0;
  for (int b = 0; b < batch_size; ++b)
    for (int p = 0; p < pages_needed[b]; ++p) c.page_table[size_t(b) * c.max_pages_per_req + p] = physical[cursor++];

  // Values.
  const int hq = spec.num_q_heads, hkv = spec.num_kv_heads, dqk = spec.head_dim_qk, dv = spec.head_dim_v;
  ValueSource values{rng, o.dist, spec.dtype};
  c.q.resize(size_t(c.total_nodes) * hq * dqk);
  for (uint16_t& x : c.q) x = values.next(o.q_scale);

  const size_t rows = size_t(c.num_pages) * P * hkv;
  const uint16_t unused_value = o.unused == UnusedFill::nan ? nan_bits(spec.dtype) : uint16_t(0);
  c.k_cache.assign(rows * dqk, unused_value);
  if (!c.mla) c.v_cache.assign(rows * dv, unused_value);
  if (o.unused == UnusedFill::random) {
    for (uint16_t& x : c.k_cache) x = values.next();
    for (uint16_t& x : c.v_cache) x = values.next();
  }
  for (int b = 0; b < batch_size; ++b) {
    for (int t = 0; t < c.kv_lens[b]; ++t) {
      const int page = c.page_table[size_t(b) * c.max_pages_per_req + t / P];
      for (int h = 0; h < hkv; ++h) {
        const size_t row = (size_t(page) * P + t % P) * hkv + h;
        const float k_scale = 1.0f + o.k_ramp * float(t) / float(c.kv_lens[b]);
        for (int d = 0; d < dqk; ++d) c.k_cache[row * dqk + d] = values.next(k_scale);
        if (!c.mla)
          for (int d = 0; d < dv; ++d) c.v_cache[row * dv + d] = values.next();
      }
    }
  }
  if (spec.kv_dtype == KDTREE_KV_DTYPE_E4M3) to_e4m3(c, o, rng);
  return c;
}

std::string VerifyComparison::summary() const {
  std::string s = "worst rel " + fmt_double("%.3e", worst_rel) + " (request " + std::to_string(worst_request) +
                  "), max abs " + fmt_double("%.3e", max_abs) + ", lse abs " + fmt_double("%.3e", max_lse_abs) +
                  ", non-finite out " + std::to_string(nan_out) + ", non-finite lse " + std::to_string(nan_lse) +
                  ", rel per request [";
  for (size_t b = 0; b < rel_err.size(); ++b) s += (b ? " " : "") + fmt_double("%.2e", rel_err[b]);
  return s + "]";
}

VerifyComparison compare_verify(const VerifyCase& c, const VerifyReference& ref, const std::vector<uint16_t>& out,
                                const float* lse) {
  if (out.size() < c.out_elems() || ref.out.size() != c.out_elems() || ref.lse.size() != c.lse_elems())
    throw std::invalid_argument("compare_verify: output sizes do not match the case");
  const size_t row_elems = size_t(c.spec.num_q_heads) * c.spec.head_dim_v;
  VerifyComparison r;
  r.rel_err.assign(c.batch_size, 0.0);
  for (int b = 0; b < c.batch_size; ++b) {
    double err2 = 0.0, ref2 = 0.0;
    size_t bad = 0;
    for (size_t e = c.node_indptr[b] * row_elems; e < c.node_indptr[b + 1] * row_elems; ++e) {
      const double x = from_half(out[e], c.spec.dtype);
      if (!std::isfinite(x)) {
        ++bad;
        continue;
      }
      const double d = x - ref.out[e];
      err2 += d * d;
      ref2 += ref.out[e] * ref.out[e];
      r.max_abs = std::max(r.max_abs, std::fabs(d));
    }
    if (lse) {
      for (int row = c.node_indptr[b] * c.spec.num_q_heads; row < c.node_indptr[b + 1] * c.spec.num_q_heads; ++row) {
        if (!std::isfinite(lse[row])) {
          ++r.nan_lse;
          continue;
        }
        r.max_lse_abs = std::max(r.max_lse_abs, std::fabs(double(lse[row]) - ref.lse[row]));
      }
    }
    r.nan_out += bad;
    r.rel_err[b] = bad ? INFINITY : ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    if (r.worst_request < 0 || r.rel_err[b] > r.worst_rel) {
      r.worst_rel = r.rel_err[b];
      r.worst_request = b;
    }
  }
  if (r.nan_lse) r.max_lse_abs = INFINITY;
  return r;
}

bool request_all_nan(const VerifyCase& c, int b, const std::vector<uint16_t>& out, const float* lse) {
  const size_t row_elems = size_t(c.spec.num_q_heads) * c.spec.head_dim_v;
  for (size_t e = c.node_indptr[b] * row_elems; e < c.node_indptr[b + 1] * row_elems; ++e)
    if (!std::isnan(from_half(out[e], c.spec.dtype))) return false;
  if (lse)
    for (int row = c.node_indptr[b] * c.spec.num_q_heads; row < c.node_indptr[b + 1] * c.spec.num_q_heads; ++row)
      if (!std::isnan(lse[row])) return false;
  return true;
}

}  // namespace kdtree::ref
