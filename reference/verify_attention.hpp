// float64 CPU reference of verify_attention: the judge of the GPU kernel.
// Inputs are host arrays in exactly the device layouts of kdtree_verify_args.
#pragma once
#include <cstdint>
#include <vector>

#include "kdtree/kdtree.h"

namespace kdtree::ref {

struct VerifyHostInputs {
  // head dims, head counts, page size, W, dtype (bf16/f16) and kv_dtype. Any
  // positive dims are accepted here: the reference does not restrict to the
  // generated grid.
  kdtree_verify_spec spec{};
  int batch_size = 0;
  int total_nodes = 0;
  int num_pages = 0;
  int max_pages_per_req = 0;
  const uint16_t* q = nullptr;           // [total_nodes, Hq, Dqk]
  const int32_t* node_indptr = nullptr;  // [batch_size + 1]
  const uint16_t* k_cache = nullptr;     // [num_pages, page_size, Hkv, Dqk] (16-bit caches)
  const uint16_t* v_cache = nullptr;     // [num_pages, page_size, Hkv, Dv]; NULL = MLA (V = k row[0:Dv])
  // spec.kv_dtype == KDTREE_KV_DTYPE_E4M3: the caches are e4m3 codes (reference/fp8.hpp)
  // in the same layouts, read as code x k_scale (K) and code x v_scale (V); k_cache
  // and v_cache are then unused. v_cache8 NULL = MLA.
  const uint8_t* k_cache8 = nullptr;
  const uint8_t* v_cache8 = nullptr;
  double k_scale = 1.0;
  double v_scale = 1.0;
  const int32_t* page_table = nullptr;  // [batch_size, max_pages_per_req]
  const int32_t* kv_lens = nullptr;     // [batch_size]
  const uint64_t* tree_mask = nullptr;  // [total_nodes, ceil(W / 64)]
  double sm_scale = 1.0;
};

struct VerifyReference {
  std::vector<double> out;  // [total_nodes, Hq, Dv]
  std::vector<double> lse;  // [total_nodes, Hq], natural log; -inf for a row that sees nothing
  // e4m3 caches: per row, the largest sm_scale * k_scale * sum_i |q_i k_i| over the
  // visible tokens, what rounding q bounds the score errors by (q quantised with
  // relative error e moves every score, and so the LSE, by at most e times it).
  std::vector<double> score_abs_bound;  // [total_nodes, Hq]; empty for 16-bit caches
};

// For request b, node i (row node_indptr[b] + i), query head h (KV head
// h / (Hq / Hkv)): token t < prefix = kv_len - n_b is always visible; token
// t >= prefix is visible iff bit (t - prefix) of the node's mask is set.
// out = softmax(sm_scale * q.k) . v over the visible tokens, lse = log sum exp;
// with e4m3 caches k and v are the dequantised values (code x scale, in float64).
// Throws std::invalid_argument on malformed input (node count outside 1..W,
// kv_len < n_b, page id out of range, head counts that do not divide, ...).
// threads: 0 = one per hardware thread; rows are independent.
VerifyReference verify_attention(const VerifyHostInputs& in, int threads = 0);

}  // namespace kdtree::ref
