// Random verify_attention inputs for tests, examples and benchmarks: random
// trees (uneven node counts), tree masks from the parents, uneven prefixes,
// scattered pages, and a comparison of a result against the reference.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kdtree/kdtree.h"
#include "reference/verify_attention.hpp"

namespace kdtree::ref {

enum class ValueDist { uniform, normal };  // uniform [-1, 1] or N(0, 1)

// What cache rows that no request reads hold: the tails of last pages, the
// unused pages. NaN catches a kernel that lets a masked or foreign row leak
// into the result (0 * NaN is NaN), as stale memory can in a real server.
enum class UnusedFill { nan, random, zero };

// A grid point's name, as the GPU tests print it and `kdtree_gpu_tests --case`
// selects it: "verify_attention[mla576/512,W=64,page=64,bf16,Hq=16,B=3]" (e4m3
// caches add kv=e4m3 after the dtype, GQA adds Hkv=), with `extra`
// ("splits=3,...") before the bracket.
std::string verify_label(const kdtree_verify_spec& spec, int batch_size, const std::string& extra = "");

struct VerifyCaseOptions {
  int min_prefix = 0;  // prefix_len = kv_len - n_b, drawn uniformly in [min, max]
  int max_prefix = 256;
  int min_nodes = 1;  // n_b drawn uniformly in [min_nodes, max_nodes]
  int max_nodes = 0;  // 0 = W
  // Request 0 gets max_nodes and max_prefix; the last request (B >= 2) gets
  // min_nodes; request 1 (B >= 3) gets min_prefix.
  bool extremes = true;
  bool scatter_pages = true;  // a random permutation of the physical pages
  int extra_pages = 5;        // unused physical pages: num_pages > pages needed
  int table_slack = 1;        // page-table columns past the longest request, filled with -1
  int max_kv_len_slack = 0;   // args.max_kv_len = longest kv_len + this
  ValueDist dist = ValueDist::uniform;
  float q_scale = 1.0f;  // multiplies q: > 1 sharpens the softmax
  // K of token t is scaled by 1 + k_ramp * t / kv_len: with k_ramp > 0 the scores
  // keep rising along the sequence, so the running softmax max moves late (the
  // kernels' rescale path) instead of settling in the first tiles.
  float k_ramp = 0.0f;
  float sm_scale = 0.0f;  // 0 = 1 / sqrt(head_dim_qk)
  UnusedFill unused = UnusedFill::nan;
  std::vector<int> prefix_lens;  // per request; overrides the random draw when not empty
  std::vector<int> node_counts;  // per request; overrides the random draw when not empty
  // e4m3 caches (spec.kv_dtype): value = code x scale. 0 = drawn at random as
  // 2^e x (1 + m / 8), e in [-8, -3], m in [0, 8), so uniform values use most of
  // e4m3's range, subnormals included. The draws come after every 16-bit draw, so
  // 16-bit cases stay what they were.
  float k_scale = 0.0f;
  float v_scale = 0.0f;
};

struct VerifyCase {
  kdtree_verify_spec spec{};  // includes num_q_heads and num_kv_heads
  bool mla = false;           // v_cache is empty; V = first head_dim_v dims of the K row
  int batch_size = 0;
  int total_nodes = 0;
  int max_kv_len = 0;
  int num_pages = 0;
  int max_pages_per_req = 0;
  int mask_words = 0;
  float sm_scale = 0.0f;
  uint64_t seed = 0;

  std::vector<uint16_t> q;        // [total_nodes, Hq, Dqk]
  std::vector<uint16_t> k_cache;  // [num_pages, page_size, Hkv, Dqk]
  std::vector<uint16_t> v_cache;  // [num_pages, page_size, Hkv, Dv]; empty for MLA
  // spec.kv_dtype == KDTREE_KV_DTYPE_E4M3: the caches as e4m3 codes (same layouts;
  // k_cache and v_cache are then empty), value = code x k_scale / v_scale.
  std::vector<uint8_t> k_cache8;
  std::vector<uint8_t> v_cache8;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  std::vector<int32_t> page_table;   // [batch_size, max_pages_per_req], -1 past each request's pages
  std::vector<int32_t> kv_lens;      // [batch_size]
  std::vector<int32_t> node_indptr;  // [batch_size + 1]
  std::vector<uint64_t> tree_mask;   // [total_nodes, mask_words]
  std::vector<int32_t> parents;      // [total_nodes]: request-local parent index, root -1
  std::vector<int> prefix_lens;      // [batch_size]
  std::vector<int> node_counts;      // [batch_size]

  // "mla576/512" or "gqa128"
  std::string head_name() const;
  bool kv_fp8() const { return spec.kv_dtype == KDTREE_KV_DTYPE_E4M3; }
  // The bytes of the K (MLA: the one) cache and of the V cache, whatever the dtype.
  const void* k_data() const { return kv_fp8() ? (const void*)k_cache8.data() : (const void*)k_cache.data(); }
  const void* v_data() const { return kv_fp8() ? (const void*)v_cache8.data() : (const void*)v_cache.data(); }
  size_t k_bytes() const { return kv_fp8() ? k_cache8.size() : k_cache.size() * 2; }
  size_t v_bytes() const { return kv_fp8() ? v_cache8.size() : v_cache.size() * 2; }
  // "verify_attention[mla576/512,W=64,page=64,bf16,Hq=16,B=3]" (kv=e4m3, Hkv as verify_label);
  // `extra` is appended inside the brackets, e.g. "splits=3".
  std::string label(const std::string& extra = "") const;
  // Views of the host arrays for the reference.
  VerifyHostInputs host_inputs() const;
  size_t out_elems() const { return size_t(total_nodes) * spec.num_q_heads * spec.head_dim_v; }
  size_t lse_elems() const { return size_t(total_nodes) * spec.num_q_heads; }
};

// A verify spec from its fields, in kdtree_verify_spec order.
inline kdtree_verify_spec make_verify_spec(int head_dim_qk, int head_dim_v, int num_q_heads, int num_kv_heads,
                                           int page_size, int max_tree_nodes, kdtree_dtype dtype,
                                           kdtree_kv_dtype kv_dtype = KDTREE_KV_DTYPE_AS_Q) {
  kdtree_verify_spec s{};
  s.head_dim_qk = head_dim_qk;
  s.head_dim_v = head_dim_v;
  s.num_q_heads = num_q_heads;
  s.num_kv_heads = num_kv_heads;
  s.page_size = page_size;
  s.max_tree_nodes = max_tree_nodes;
  s.dtype = dtype;
  s.kv_dtype = kv_dtype;
  return s;
}

// spec: head dims, head counts, page size, W, dtype. MLA when v is not a separate
// cache, i.e. head_dim_qk == 576 (or any head_dim_v < head_dim_qk). Deterministic in seed.
VerifyCase build_verify_case(const kdtree_verify_spec& spec, int batch_size, uint64_t seed,
                             const VerifyCaseOptions& options = {});

struct VerifyComparison {
  std::vector<double> rel_err;  // per request: ||out - ref|| / ||ref|| (inf if it holds a non-finite value)
  double worst_rel = 0.0;
  int worst_request = -1;
  double max_abs = 0.0;      // over finite elements
  double max_lse_abs = 0.0;  // 0 when no lse was given
  size_t nan_out = 0;        // non-finite output elements (NaN: e.g. poison left unwritten)
  size_t nan_lse = 0;
  bool ok(double rel_tol, double lse_tol) const {
    return nan_out == 0 && nan_lse == 0 && worst_rel < rel_tol && max_lse_abs < lse_tol;
  }
  // "worst rel 1.2e-03 (request 2), max abs 3.4e-04, lse 1.0e-05, rel per request [..]"
  std::string summary() const;
};

// out: the kernel's [total_nodes, Hq, Dv] 16-bit output; lse: [total_nodes, Hq] or NULL.
VerifyComparison compare_verify(const VerifyCase& c, const VerifyReference& ref, const std::vector<uint16_t>& out,
                                const float* lse = nullptr);

// True when every output element of request b is NaN (and every lse, when given).
bool request_all_nan(const VerifyCase& c, int b, const std::vector<uint16_t>& out, const float* lse = nullptr);

}  // namespace kdtree::ref
