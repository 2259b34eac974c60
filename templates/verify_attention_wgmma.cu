// verify_attention_wgmma: MLA tree attention on Hopper's warpgroup MMA (sm_90a).
// The contract, the segment walk (uniform splits or stream-K) and the combine are
// verify_attention.cu's and verify_attention_qsplit.cu's; what differs is where
// the operands live. mma.sync on Hopper reads both operands through ldmatrix and
// is capped by the shared-memory port at about 40% of the tensor rate; wgmma reads
// them from shared memory by descriptor (or A from registers), so no warp loads a
// B fragment.
//
// A CTA owns BLOCK_M = 64 rows (node x head) of one request and runs two
// warpgroups over them (wgmma's m64: a warpgroup's four warps hold 16 rows each).
// Shared memory holds Q's 512 latent dims, two slots of BLOCK_N = 64 K rows (MLA:
// V is the first 512 dims of the same rows) and two P tiles, in 64-dim column
// blocks of 128-byte swizzled rows (wgmma.cuh). Q's 64 rope dims stay in
// registers, and slot 1's P takes their place. The KV tiles go in pairs: tile 2j
// to slot 0, 2j + 1 to slot 1. Per pair, warpgroup g:
//   compute_qk       S_g = Q K_g^T over its own slot's 64 tokens (m64n64k16 x 36:
//                    the rope steps first, with A from registers, then the
//                    latent ones), each column range as its copies complete
//   logits_mask      edge tiles only (is_edge_tile)
//   row max          exchanged through shared memory; both warpgroups run the
//                    same lazy online-softmax update over both tiles' maxima, so
//                    they agree on every reference max and rescale factor
//   P                exp2 of the scaled scores: to registers (the A operand of its
//                    own tile's PV) and to shared memory (the other warpgroup's)
//   compute_pv       O_g = alpha O_g + P_0 V_0[:, 256g ..) + P_1 V_1[:, 256g ..)
//                    (m64n256k16 x 4 per tile; slot 0's tile first: warpgroup 0
//                    issues each k16 step as soon as its P is packed, so the
//                    exponentials of both warpgroups run under those MMAs)
// Copies (TMA for whole tiles, cp.async for a segment's partial last one) complete
// on an mbarrier per (slot, column range): range 0 = V columns [0, 256), range 1 =
// [256, 512), range 2 = the rope. A range is refilled by the warpgroup that reads it
// last, once its MMAs on it have retired: the rope by the slot's QK warpgroup right
// after its QK (reading the page table, and keeping the tile's cache slots in shared
// memory), V column half h by warpgroup h after its PV over that slot (from those
// slots). So the next pair's copies run under this pair's PV and the rope copies
// under the softmax; the CTA synchronises twice a pair (row max, P) and never waits
// for a copy it did not need.

#include "verify_attention_wgmma_config.h"
#include "verify_attention_common.cuh"
#include "verify_attention_combine_stream.cuh"
#include "wgmma.cuh"
#include "verify_attention_tma.h"
#include "verify_attention_wgmma_common.cuh"

// Byte offsets in dynamic shared memory (codegen's WgmmaSmemLayout): Q at 0.
constexpr int SMEM_K = KD_SMEM_K;      // the two K slots
constexpr int SMEM_P = KD_SMEM_P;      // slot 0's P
constexpr int SMEM_RED = KD_SMEM_RED;  // [WGS][BLOCK_M] floats
constexpr int SMEM_BAR = KD_SMEM_BAR;  // [SLOTS][RANGES] mbarriers
constexpr int SMEM_ROWS = KD_SMEM_ROWS;  // [SLOTS][BLOCK_N] cache slot indices
constexpr int SMEM_WALK = KD_SMEM_WALK;

constexpr int WGS = THREADS / WG_THREADS;
constexpr int SLOTS = STAGES;
constexpr int SMEM_P1 = V_BLOCKS * Q_BLOCK_BYTES;  // slot 1's P, where Q's rope block would lie
constexpr int S_TILES = BLOCK_N / 8;               // n8 tiles of S
constexpr int V_COLS = HEAD_DIM_V / WGS;           // a warpgroup's O columns
constexpr int O_TILES = V_COLS / 8;
constexpr int ROPE_STEPS = (DIM_BLOCKS - V_BLOCKS) * 4;  // with Q from registers
constexpr int PV_STEPS = BLOCK_N / 16;
constexpr int STAGE_STRIDE = HEAD_DIM_V + 8;  // floats a staged O row (8 banks on: a half-warp's float2 stores are conflict-free)
static_assert(IS_MLA && !KV_FP8, "the wgmma family: MLA over 16-bit caches");
static_assert(BLOCK_M == 64 && WARPS_M == 4 && WARP_ROWS == 16 && WGS == 2 && WARPS_N == WGS,
              "two warpgroups, each all 64 rows (wgmma m64)");
static_assert(BLOCK_N == 64 && SLOTS == 2 && V_COLS == 256, "the MMA shapes of wgmma.cuh, one slot per warpgroup");
static_assert(HEAD_DIM == HEAD_DIM_V + 64 && HEAD_DIM_V == 2 * V_COLS, "MLA: 512 latent dims and 64 rope dims");
static_assert(SMEM_K == SMEM_P1 + Q_BLOCK_BYTES && SMEM_P == SMEM_K + SLOTS * K_SLOT_BYTES &&
                  SMEM_RED >= SMEM_P + BLOCK_M * ROW_BYTES && SMEM_BAR >= SMEM_RED + WGS * BLOCK_M * 4 &&
                  SMEM_ROWS >= SMEM_BAR + SLOTS * RANGES * 8 && SMEM_WALK >= SMEM_ROWS + SLOTS * BLOCK_N * 4,
              "the generator's layout");
static_assert(BLOCK_M * STAGE_STRIDE * 4 <= SLOTS * K_SLOT_BYTES && CLUSTER_STASH_BYTES <= SLOTS * K_SLOT_BYTES,
              "O's rows staged, or a cluster's split stashed, in the K slots");
static_assert(SMEM_K % 1024 == 0 && K_SLOT_BYTES % 1024 == 0 && SMEM_P % 1024 == 0 && SMEM_P1 % 1024 == 0,
              "swizzle atoms are 1024-aligned");
static_assert(SMEM_BAR % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(BLOCK_N % KV_TMA_BOX_ROWS == 0, "whole TMA boxes per tile");
static_assert(sizeof(SegmentWalk) <= KDTREE_SEGMENT_WALK_BYTES && SMEM_WALK % 8 == 0, "the walk's bytes");
static_assert((THREADS + 2) * 8 <= SMEM_P1, "the stream-K scan runs in Q's space before Q is loaded");

// ---- Copies.

// Q's latent dims into shared memory (BLOCK_M rows from row0; rows past rows_total
// zero-filled, their results dropped): a row is 8 threads, one 16-byte unit of each
// column block apiece. The caller commits and waits.
static __device__ __forceinline__ void load_q_latent(const kdtree_verify_params& p, const Request& req, int row0,
                                                     int rows_total, kd_u32 sq) {
  const int unit = threadIdx.x % 8;
  for (int r = threadIdx.x / 8; r < BLOCK_M; r += THREADS / 8) {
    const int gr = row0 + r;
    const bool ok = gr < rows_total;
    const kd_u16* src = (const kd_u16*)p.q + (ok ? out_row(p, req.node_base, gr, 0) : 0) * HEAD_DIM + unit * 8;
    const kd_u32 dst = sq + sw128(r, unit);
#pragma unroll
    for (int c = 0; c < V_BLOCKS; ++c) kd_cp_async16(dst + c * Q_BLOCK_BYTES, src + c * 64, ok ? 16 : 0);
  }
}

// Q's rope dims of this thread's two rows as the A fragments of the rope k16 steps
// (kd_wgmma_m64n64k16_rs): qr[k][h] row r_lo + 8h, qr[k][2 + h] the same 8 dims on.
static __device__ __forceinline__ void load_q_rope(const kdtree_verify_params& p, const Request& req, int row0,
                                                   int rows_total, int r_lo, kd_u32 (&qr)[ROPE_STEPS][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = row0 + r_lo + 8 * h;
    const bool ok = gr < rows_total;
    const kd_u32* src = (const kd_u32*)((const kd_u16*)p.q + (ok ? out_row(p, req.node_base, gr, 0) : 0) * HEAD_DIM +
                                        HEAD_DIM_V + (lane % 4) * 2);
#pragma unroll
    for (int k = 0; k < ROPE_STEPS; ++k) {
      qr[k][h] = ok ? __ldg(src + k * 8) : 0u;
      qr[k][2 + h] = ok ? __ldg(src + k * 8 + 4) : 0u;
    }
  }
}

// ---- compute_qk: S = Q K^T over all 576 dims of a slot: the rope steps with A
// from registers (their copies were issued first), then the latent steps from
// shared memory (A: Q, K-major; B: the slot's 64 token rows, K-major; a k16 step
// is 32 bytes into a column block's rows). Each column range is waited for just
// before its steps. Committed, not waited.
static __device__ __forceinline__ void compute_qk(float (&s)[S_TILES][4], kd_u32 sq, kd_u32 slot, kd_u32 bars,
                                                  kd_u32 parity, const kd_u32 (&qr)[ROPE_STEPS][4]) {
  const kd_u64 a0 = kd_wgmma_desc(sq, 16, 1024);
  const kd_u64 b0 = kd_wgmma_desc(slot, 16, 1024);
  kd_wgmma_pin(s);
  wait_range(bars + 2 * 8, parity);
  kd_wgmma_fence();
#pragma unroll
  for (int k = 0; k < ROPE_STEPS; ++k) {
    const kd_u64 b = b0 + (kd_u64)((V_BLOCKS * K_BLOCK_BYTES + k * 32) >> 4);
    kd_wgmma_m64n64k16_rs<IS_BF16>(s, qr[k], b, k > 0);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    wait_range(bars + r * 8, parity);
#pragma unroll
    for (int ks = range_lo(r) * 4; ks < range_hi(r) * 4; ++ks) {
      const kd_u64 a = a0 + (kd_u64)(((ks / 4) * Q_BLOCK_BYTES + (ks % 4) * 32) >> 4);
      const kd_u64 b = b0 + (kd_u64)(((ks / 4) * K_BLOCK_BYTES + (ks % 4) * 32) >> 4);
      kd_wgmma_m64n64k16<IS_BF16>(s, a, b, true);
    }
  }
  kd_wgmma_commit();
}

// ---- compute_pv: O_g += P V[:, this warpgroup's 256 columns] over one slot. B is
// V as it lies (MN-major): 16 token rows per step, 64-column blocks K_BLOCK_BYTES
// apart. A is this warpgroup's own P in registers, or the other's in shared memory
// (K-major: 64 rows of 64 tokens, one column block). Committed, not waited.
// B of a slot's PV: this warpgroup's 256 V columns, MN-major.
static __device__ __forceinline__ kd_u64 pv_v_desc(kd_u32 slot, int wg) {
  return kd_wgmma_desc(slot + wg * (V_COLS / 64) * K_BLOCK_BYTES, K_BLOCK_BYTES, 1024);
}
// One k16 step of the PV with P from registers (a: that step's A fragments); no fence, no commit.
static __device__ __forceinline__ void pv_rs_step(float (&o)[O_TILES][4], const kd_u32 (&a)[4], kd_u64 b0, int kk) {
  kd_wgmma_m64n256k16_bt_rs<IS_BF16>(o, a, b0 + (kd_u64)((kk * 16 * ROW_BYTES) >> 4), true);
}
static __device__ __forceinline__ void compute_pv_rs(float (&o)[O_TILES][4], const kd_u32 (&pf)[PV_STEPS][4],
                                                     kd_u32 slot, int wg) {
  const kd_u64 b0 = pv_v_desc(slot, wg);
  kd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk) pv_rs_step(o, pf[kk], b0, kk);
  kd_wgmma_commit();
}
static __device__ __forceinline__ void compute_pv_ss(float (&o)[O_TILES][4], kd_u32 sp, kd_u32 slot, int wg) {
  const kd_u64 a0 = kd_wgmma_desc(sp, 16, 1024);
  const kd_u64 b0 = pv_v_desc(slot, wg);
  kd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk)
    kd_wgmma_m64n256k16_bt<IS_BF16>(o, a0 + (kd_u64)((kk * 32) >> 4), b0 + (kd_u64)((kk * 16 * ROW_BYTES) >> 4), true);
  kd_wgmma_commit();
}

// ---- A segment's tile pairs and its rows, as warpgroup WG (a template parameter,
// so that ptxas sees no thread-dependent branch around a wgmma: it would serialise them).
template <int WG, bool CLUSTER>
static __device__ __forceinline__ void run_segment(const kdtree_verify_params& p, const kdtree_kv_tma& kv_tma,
                                                   const SegmentWalk& walk,
                                                   const Request& req, const KvSource& kv_src, int row0,
                                                   int rows_total, int t_begin, int t_end, int (&fills)[SLOTS],
                                                   const kd_u32 (&qr)[ROPE_STEPS][4],
                                                   const kd_u64 (&words)[2][MASK_WORDS], bool bad_page, kd_u32 sq,
                                                   float* red, float* stage) {
  const int wt = threadIdx.x % WG_THREADS;
  const int lane = threadIdx.x % 32;
  const int r_lo = ((threadIdx.x / 32) % 4) * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8
  const kd_u32 sk = sq + SMEM_K;
  const kd_u32 bar0 = sq + SMEM_BAR;  // slot s, range r at bar0 + (s * RANGES + r) * 8
  const kd_u32 my_slot = sk + WG * K_SLOT_BYTES;
  const kd_u32 my_bars = bar0 + WG * RANGES * 8;
  const kd_u32 my_p = sq + (WG == 0 ? SMEM_P : SMEM_P1);  // this warpgroup's P tile
  const kd_u32 rows0 = sq + SMEM_ROWS;  // slot 0's row table; slot 1's BLOCK_N * 4 on
  const kd_u32 my_rows = rows0 + WG * BLOCK_N * 4;
  const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;
  const int n_pairs = (n_tiles + 1) / 2;

  float o[O_TILES][4];
#pragma unroll
  for (int j = 0; j < O_TILES; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-KD_INF, -KD_INF}, l_run[2] = {0.f, 0.f};  // l: this thread's columns' share

#pragma unroll 1
  for (int j = 0; j < n_pairs; ++j) {
    const int my_tile = 2 * j + WG;
    const bool mine = my_tile < n_tiles;
    const bool has_1 = 2 * j + 1 < n_tiles;  // slot 1's tile of this pair
    const kd_u32 parity0 = kd_u32(fills[0] + j) & 1u, parity1 = kd_u32(fills[1] + j) & 1u;
    const int t0 = t_begin + my_tile * BLOCK_N;

    float s[S_TILES][4];
    float mx[2] = {-KD_INF, -KD_INF};
    if (mine) {
      compute_qk(s, sq, my_slot, my_bars, WG == 0 ? parity0 : parity1, qr);
      kd_wgmma_wait<0>();
      kd_wgmma_pin(s);
      // The rope range is read by this QK only: the slot's next tile's rope starts now.
      if (my_tile + SLOTS < n_tiles)
        fill_range<2, true>(p, kv_tma, kv_src, t0 + SLOTS * BLOCK_N, t_end, my_slot, my_bars + 16, my_rows, wt, bad_page);

      logits_mask_row_max(s, t0, req, t_end, words, mx);
    }

    // ---- row max over both tiles of the pair.
    exchange_row_max<WG>(mx, red, r_lo);

    // ---- P: the lazy online softmax of both rows (log2 domain), to registers
    // (pf: the A fragments of this tile's PV) and to shared memory. Warpgroup 0
    // issues its PV over its own slot one k16 step at a time, each as soon as that
    // step's P is packed: the exponentials (MUFU, 16 a clock per SM, both
    // warpgroups' at once) run under the tensor pipe instead of before it.
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) m_use[h] = lazy_max_update(mx[h], p.scale_log2, m_run[h], l_run[h], alpha[h]);
    // (the O rescale first, which most pairs of a long prefix skip)
    if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
      for (int jt = 0; jt < O_TILES; ++jt) {
        o[jt][0] *= alpha[0];
        o[jt][1] *= alpha[0];
        o[jt][2] *= alpha[1];
        o[jt][3] *= alpha[1];
      }
    }
    kd_wgmma_pin(o);
    kd_u32 pf[PV_STEPS][4];
    const kd_u64 pv_b0 = pv_v_desc(sk, 0);  // slot 0, warpgroup 0's V columns
#pragma unroll
    for (int kk = 0; kk < PV_STEPS; ++kk) {
      if (mine) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r_lo + 8 * h;
#pragma unroll
          for (int jt = 2 * kk; jt < 2 * kk + 2; ++jt) {
            const float p0 = lazy_exp(s[jt][2 * h], p.scale_log2, m_use[h]);
            const float p1 = lazy_exp(s[jt][2 * h + 1], p.scale_log2, m_use[h]);
            l_run[h] += p0 + p1;
            const kd_u32 packed = kd_pack2<IS_BF16>(p0, p1);
            pf[kk][(jt % 2) * 2 + h] = packed;
            const int col = jt * 8 + (lane % 4) * 2;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(my_p + sw128(r, col / 8) + (col % 8) * 2), "r"(packed)
                         : "memory");
          }
        }
      }
      if (WG == 0) {  // slot 0 with its own P: no wait for the other warpgroup
        kd_wgmma_fence();
        pv_rs_step(o, pf[kk], pv_b0, kk);
      }
    }
    if (WG == 0) kd_wgmma_commit();
    kd_fence_proxy_async();
    __syncthreads();                            // both P tiles are in shared memory
    if (WG == 0) {
      if (has_1) {
        wait_range(bar0 + RANGES * 8, parity1);  // slot 1's V columns this warpgroup reads
        compute_pv_ss(o, sq + SMEM_P1, sk + K_SLOT_BYTES, 0);
      }
    } else {
      wait_range(bar0 + 1 * 8, parity0);
      compute_pv_ss(o, sq + SMEM_P, sk, 1);
      if (has_1) compute_pv_rs(o, pf, sk + K_SLOT_BYTES, 1);
    }

    // ---- refills: V column half wg of each slot, once this warpgroup's PV over it retired.
    if (has_1) {
      kd_wgmma_wait<1>();
    } else {
      kd_wgmma_wait<0>();
    }
    if (2 * j + 2 < n_tiles) {
      const int tn = t_begin + (2 * j + 2) * BLOCK_N;
      if (WG == 0) fill_range<0, false>(p, kv_tma, kv_src, tn, t_end, sk, bar0, rows0, wt, bad_page);
      if (WG == 1) fill_range<1, false>(p, kv_tma, kv_src, tn, t_end, sk, bar0 + 8, rows0, wt, bad_page);
    }
    kd_wgmma_wait<0>();
    kd_wgmma_pin(o);
    if (2 * j + 3 < n_tiles) {
      const int tn = t_begin + (2 * j + 3) * BLOCK_N;
      const kd_u32 slot = sk + K_SLOT_BYTES, bars = bar0 + RANGES * 8;
      if (WG == 0) fill_range<0, false>(p, kv_tma, kv_src, tn, t_end, slot, bars, rows0 + BLOCK_N * 4, wt, bad_page);
      if (WG == 1) fill_range<1, false>(p, kv_tma, kv_src, tn, t_end, slot, bars + 8, rows0 + BLOCK_N * 4, wt, bad_page);
    }
  }
  fills[0] += n_pairs;
  fills[1] += n_tiles / 2;

  // ---- row sums over the row's 4 lanes and both warpgroups.
  float l_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_row[h] = l_run[h];
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
    if (lane % 4 == 0) red[WG * BLOCK_M + r_lo + 8 * h] = l_row[h];
  }
  // (Synchronises the CTA: both warpgroups' last PV has read its V from the slots.)
  const bool poisoned = bad_page_seen(p, bad_page);

  if constexpr (CLUSTER) {
    // ---- the rows as split partials in the idle K slots (a warp's 4-byte stores to
    // its 8 rows of CLUSTER_ROW fall in distinct banks); verify_rows merges them.
    unsigned char* stash = (unsigned char*)stage;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r_lo + 8 * h;
      const float inv = cluster_row_factor(p, red, r);
      kd_u32* srow = (kd_u32*)((kd_u16*)stash + r * CLUSTER_ROW + WG * V_COLS + (lane % 4) * 2);
#pragma unroll
      for (int jt = 0; jt < O_TILES; ++jt) srow[jt * 4] = kd_pack2<IS_BF16>(o[jt][2 * h] * inv, o[jt][2 * h + 1] * inv);
    }
    cluster_stash_lse(stash, red, m_run, poisoned, r_lo, WG == 0 && lane % 4 == 0);
  } else {
    // ---- O staged as fp32 rows in the idle K slots (row r_lo + 8h, this warpgroup's
    // columns jt * 8 + 2t), then written a warp per row (write_staged_rows). The
    // stride puts a half-warp's 4 rows of 8 floats in distinct banks.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* srow = stage + (r_lo + 8 * h) * STAGE_STRIDE + WG * V_COLS + (lane % 4) * 2;
#pragma unroll
      for (int jt = 0; jt < O_TILES; ++jt) *(float2*)(srow + jt * 8) = make_float2(o[jt][2 * h], o[jt][2 * h + 1]);
    }
    __syncthreads();  // every row's two halves are staged
    write_staged_rows<STAGE_STRIDE>(p, walk, req, row0, rows_total, stage, red, m_run, poisoned, r_lo,
                                    WG == 0 && lane % 4 == 0);
  }
}

// The kernel body; CLUSTER: the entry whose splits merge in a thread-block cluster.
template <bool CLUSTER>
static __device__ __forceinline__ void verify_rows(const kdtree_verify_params& p, const kdtree_kv_tma& kv_tma) {
  kd_launch_dependents();  // the split combine may launch now; it waits for this grid's writes
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  float* red = (float*)(smem_raw + SMEM_RED);  // [WGS][BLOCK_M]: row maxima, then row sums
  float* stage = (float*)(smem_raw + SMEM_K);  // the epilogue's O rows, once a segment's tiles are done
  const kd_u32 sq = kd_smem_addr(smem_raw);
  const kd_u32 sk = sq + SMEM_K;
  const kd_u32 bar0 = sq + SMEM_BAR;  // slot s, range r at bar0 + (s * RANGES + r) * 8

  // Warp-uniform to ptxas by the shuffle: a wgmma under a branch it must treat as
  // divergent is serialised.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / WG_THREADS, 0);
  const int wt = threadIdx.x % WG_THREADS;
  const int lane = threadIdx.x % 32;
  const int r_lo = ((threadIdx.x / 32) % 4) * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8

  if (threadIdx.x == 0) {
    for (int i = 0; i < SLOTS * RANGES; ++i) kd_mbar_init(bar0 + i * 8, WG_THREADS);
  }
  // Fills of each slot before the current segment: phase parities of its mbarriers.
  int fills[SLOTS] = {0, 0};

  SegmentWalk& walk = *(SegmentWalk*)(smem_raw + SMEM_WALK);
  walk_begin(p, walk, (long long*)smem_raw);
#pragma unroll 1
  for (bool first = true;; first = false) {
    __syncthreads();  // the last segment's reads of walk.seg and of shared memory are done (and the mbarriers initialised)
    if (threadIdx.x == 0) walk_next(p, walk, first);
    __syncthreads();
    if (walk.done) {
      if (threadIdx.x == 0) walk_end(p, walk);
      break;
    }
    const Segment sg = walk.seg;
    const Request req = load_request(p, sg.b);
    if (!req.valid) {
      // Malformed request: one segment writes NaN to every row it claims (the flag says why).
      if (sg.m_tile == 0 && sg.t_begin == 0) {
        if (p.error_flags && threadIdx.x == 0) atomicOr(p.error_flags, request_errors(p, req));
        poison_request(p, req, 0);
      }
      continue;
    }
    const int rows_total = req.n_nodes * p.group;
    const int row0 = sg.m_tile * BLOCK_M;
    if (row0 >= rows_total) continue;
    const int t_begin = sg.t_begin;
    int t_end = min(req.kv_len, sg.t_end);
    if (t_begin >= t_end) {
      if constexpr (!CLUSTER) continue;  // the combine skips splits past kv_len
      t_end = t_begin;  // a cluster's split past kv_len: no tiles, it stashes LSE -inf and merges its rows
    }
    const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;

    // Q, then the first pair's tiles (the slots start free), each range by its filler.
    bool bad_page = false;
    const KvSource kv_src = kv_source(p, sg.b, 0);  // MLA: K rows, V their first HEAD_DIM_V dims
    load_q_latent(p, req, row0, rows_total, sq);
    kd_cp_async_commit();
    kd_u32 qr[ROPE_STEPS][4];
    load_q_rope(p, req, row0, rows_total, r_lo, qr);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      if (s < n_tiles) {
        const kd_u32 slot = sk + s * K_SLOT_BYTES, bars = bar0 + s * RANGES * 8;
        const int t0 = t_begin + s * BLOCK_N;
        const kd_u32 rows = sq + SMEM_ROWS + s * BLOCK_N * 4;
        if (wg == 0) fill_range<0, true>(p, kv_tma, kv_src, t0, t_end, slot, bars, rows, wt, bad_page);
        if (wg == 1) fill_range<1, true>(p, kv_tma, kv_src, t0, t_end, slot, bars + 8, rows, wt, bad_page);
        if (wg == s) fill_range<2, true>(p, kv_tma, kv_src, t0, t_end, slot, bars + 16, rows, wt, bad_page);
      }
    }
    kd_cp_async_wait<0>();  // Q's group (the K copies complete on their mbarriers)
    kd_fence_proxy_async();
    __syncthreads();

    // This thread's two rows' mask words.
    kd_u64 words[2][MASK_WORDS];
    row_mask_words(p, req, row0, rows_total, r_lo, words);

    if (wg == 0) {
      run_segment<0, CLUSTER>(p, kv_tma, walk, req, kv_src, row0, rows_total, t_begin, t_end, fills, qr, words, bad_page, sq, red, stage);
    } else {
      run_segment<1, CLUSTER>(p, kv_tma, walk, req, kv_src, row0, rows_total, t_begin, t_end, fills, qr, words, bad_page, sq, red, stage);
    }
    if constexpr (CLUSTER) {  // both warpgroups' rows are stashed (or none: LSE -inf)
      cluster_merge(p, req, row0, rows_total, 0, (unsigned char*)stage);
      kd_fence_proxy_async();  // these reads of the slots before any later copies into them
    }
  }  // segments
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) kdtree_verify_attention(const kdtree_verify_params p,
                                                                           const __grid_constant__ kdtree_kv_tma kv_tma) {
  verify_rows<false>(p, kv_tma);
}

// Uniform splits merged in a thread-block cluster: launched as clusters of
// p.cluster_splits CTAs along z, with cluster_splits > 1.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
    kdtree_verify_attention_cluster(const kdtree_verify_params p, const __grid_constant__ kdtree_kv_tma kv_tma) {
  verify_rows<true>(p, kv_tma);
}
