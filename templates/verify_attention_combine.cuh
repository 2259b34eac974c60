// The split combine of the verify_attention kernels: merges the 16-bit partials of
// uniform KV splits by their LSE (kdtree_verify_combine), and merge_row, which
// the stream-K combine (verify_attention_combine_stream.cuh) shares. Included by
// each verify_attention template after verify_attention_common.cuh.
#ifndef KDTREE_VERIFY_ATTENTION_COMBINE_CUH
#define KDTREE_VERIFY_ATTENTION_COMBINE_CUH

#include "verify_attention_common.cuh"

// Merges the split partials of each (node, head) row by their LSE. A row is
// HEAD_DIM_V / 4 threads, each owning four columns (8-byte loads).
// The generator launches COMBINE_THREADS threads and COMBINE_ROWS rows per CTA.
constexpr int COMBINE_THREADS = KD_COMBINE_THREADS;
constexpr int COMBINE_ROW_THREADS = KD_COMBINE_ROW_THREADS;
// Splits whose loads a thread holds in flight at once: 8 keeps the kernel at 54
// registers (16 took 90, 5 CTAs per SM, too few loads in flight for the common
// 2-4 splits).
constexpr int COMBINE_BATCH = 8;
constexpr int COMBINE_ROWS = COMBINE_THREADS / COMBINE_ROW_THREADS;
static_assert(HEAD_DIM_V % (4 * COMBINE_ROW_THREADS) == 0, "combine columns");

// Merges the `splits` partials of output row `row` (this thread's columns col0,
// col0 + COMBINE_ROW_THREADS * 4, ...); partial(s) is piece s's partial row.
// One pass with a running max: each batch issues all of its BATCH LSE and 16-byte
// partial loads before using any, so a thread waits on memory once per batch
// rather than once per split.
template <int BATCH, typename PartialRow>
static __device__ __forceinline__ void merge_row(const kdtree_verify_params& p, long long row, int splits, int col0,
                                                 PartialRow partial) {
  bool nan = false;
  float m_use = 0.f, wsum = 0.f;
  for (int c = col0; c < HEAD_DIM_V; c += COMBINE_ROW_THREADS * 4) {
    float m = -KD_INF;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    wsum = 0.f;
    for (int s0 = 0; s0 < splits; s0 += BATCH) {
      float4 v[BATCH];
      float w[BATCH];
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const bool in = s0 + i < splits;
        const long long pr = in ? partial(s0 + i) : 0;
        w[i] = in ? p.partial_lse[pr] : -KD_INF;
        const uint2 u = in ? *(const uint2*)((const kd_u16*)p.partial_o + pr * HEAD_DIM_V + c) : make_uint2(0u, 0u);
        const float2 lo = kd_unpack2<IS_BF16>(u.x), hi = kd_unpack2<IS_BF16>(u.y);
        v[i] = make_float4(lo.x, lo.y, hi.x, hi.y);
      }
      float m_new = m;
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        nan |= w[i] != w[i];
        m_new = fmaxf(m_new, w[i]);
      }
      m_use = m_new == -KD_INF ? 0.f : m_new;  // splits that saw nothing weigh 0
      const float rescale = kd_exp2(m - m_use);
      m = m_new;
      wsum *= rescale;
      acc.x *= rescale;
      acc.y *= rescale;
      acc.z *= rescale;
      acc.w *= rescale;
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const float wi = kd_exp2(w[i] - m_use);
        wsum += wi;
        acc.x += wi * v[i].x;
        acc.y += wi * v[i].y;
        acc.z += wi * v[i].z;
        acc.w += wi * v[i].w;
      }
    }
    const float inv = nan ? KD_NAN : (wsum > 0.f ? 1.f / wsum : KD_NAN);
    kd_u32* out = (kd_u32*)((kd_u16*)p.out + row * HEAD_DIM_V + c);
    out[0] = kd_pack2<IS_BF16>(acc.x * inv, acc.y * inv);
    out[1] = kd_pack2<IS_BF16>(acc.z * inv, acc.w * inv);
  }
  if (p.lse && col0 == 0) p.lse[row] = nan ? KD_NAN : (m_use + kd_log2(wsum)) * 0.69314718055994531f;
}

// Uniform splits: the grid is (row blocks, requests), so a CTA finds its request
// with one load rather than a search of node_indptr (a chain of dependent loads
// that bound this kernel). CTA (x, b) merges request b's rows x * COMBINE_ROWS + r,
// stepping by gridDim.x * COMBINE_ROWS.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) kdtree_verify_combine(const kdtree_verify_params p) {
  const long long rows = (long long)p.total_nodes * p.num_q_heads;
  const Request req = load_request(p, blockIdx.y);
  // The request's bounds are inputs, read while the main kernel finishes; every CTA
  // waits for it, so this grid never completes before the main kernel does.
  kd_grid_dependency_wait();
  if (!req.valid) return;  // the main kernel wrote its rows as NaN
  const int splits = min(p.num_splits, (req.kv_len + p.split_tokens - 1) / p.split_tokens);
  const int req_rows = req.n_nodes * p.num_q_heads;
  for (int local = blockIdx.x * COMBINE_ROWS + threadIdx.x / COMBINE_ROW_THREADS; local < req_rows;
       local += gridDim.x * COMBINE_ROWS) {
    const long long row = (long long)req.node_base * p.num_q_heads + local;
    merge_row<COMBINE_BATCH>(p, row, splits, (threadIdx.x % COMBINE_ROW_THREADS) * 4,
                             [&](int s) { return (long long)s * rows + row; });
  }
}

#endif  // KDTREE_VERIFY_ATTENTION_COMBINE_CUH
