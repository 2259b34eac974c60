// What every wgmma verify_attention kernel (MLA over 16-bit and e4m3 caches, GQA)
// does the same way to the rows of a warpgroup's S tile: the 128-byte swizzle of
// its shared-memory operands, the tree mask and the row maxima (wgmma's m64nN fp32
// accumulator layout: a thread holds rows r_lo and r_lo + 8), and the rows' mask words.
#ifndef KDTREE_VERIFY_ATTENTION_WGMMA_ROWS_CUH
#define KDTREE_VERIFY_ATTENTION_WGMMA_ROWS_CUH

#include "verify_attention_common.cuh"

constexpr int ROW_BYTES = 128;  // a swizzled row

// Byte offset of 16-byte unit u of row r in a column block of swizzled rows.
static __device__ __forceinline__ kd_u32 sw128(int r, int u) { return r * ROW_BYTES + ((u ^ (r & 7)) << 4); }

// ---- logits_mask on S (one tile of 8 S_TILES tokens, a thread's rows r_lo and r_lo + 8
// as m64nN's accumulator layout: s[jt][2h + e] is token t0 + 8 jt + 2 (lane % 4) + e
// of row half h): prefix tokens visible, tree tokens by the rows' mask bits, none
// past t_end; then each row's max over the tile (its 4 lanes).
template <int S_TILES>
static __device__ __forceinline__ void logits_mask_row_max(float (&s)[S_TILES][4], int t0, const Request& req, int t_end,
                                                           const kd_u64 (&words)[2][MASK_WORDS], float (&mx)[2]) {
  const int lane = threadIdx.x % 32;
  if (is_edge_tile(t0, req, t_end)) {
#pragma unroll
    for (int jt = 0; jt < S_TILES; ++jt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = t0 + jt * 8 + (lane % 4) * 2 + (e & 1);
        if (!token_visible(t, t_end, req, words[e >> 1])) s[jt][e] = -KD_INF;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int jt = 0; jt < S_TILES; ++jt) mx[h] = fmaxf(mx[h], fmaxf(s[jt][2 * h], s[jt][2 * h + 1]));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
}

// This thread's two rows (r_lo, r_lo + 8 of the tile at row0): their tree nodes' mask
// words (0 past the request's rows).
static __device__ __forceinline__ void row_mask_words(const kdtree_verify_params& p, const Request& req, int row0,
                                                      int rows_total, int r_lo, kd_u64 (&words)[2][MASK_WORDS]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = row0 + r_lo + 8 * h;
    const long long node = gr < rows_total ? req.node_base + gr / p.group : -1;
#pragma unroll
    for (int w = 0; w < MASK_WORDS; ++w) words[h][w] = node >= 0 ? __ldg(p.tree_mask + node * MASK_WORDS + w) : 0ull;
  }
}

#endif  // KDTREE_VERIFY_ATTENTION_WGMMA_ROWS_CUH
