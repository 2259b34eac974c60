// verify_attention_wgmma_e4m3: MLA tree attention over an e4m3 KV cache on Hopper's
// native fp8 warpgroup MMA (sm_90a, wgmma .e4m3, fp32 accumulation: twice the
// bf16 rate). The schedule is verify_attention_wgmma.cu's (tile pairs, one slot
// per warpgroup, the row maxima exchanged once a pair, each column range refilled
// by its last reader, verify_attention_wgmma_common.cuh), with four slots instead of
// two: e4m3 slots are half the size, so a second pair's copies are in flight while
// a pair is computed (pair j on slots 2 (j % 2), + 1). What differs besides is that
// every operand is e4m3:
//   - Q is quantised per (node, head) row as it is staged, scale = amax / 448 over
//     all 576 dims (kd_e4m3x4_pack), and the row's scale joins the softmax scale
//     (p.scale_log2 holds sm_scale x log2(e) x k_scale). Its 512 latent dims lie
//     in four 128-dim column blocks of 128-byte swizzled rows; its 64 rope dims
//     stay in registers as the A fragments of the two rope k32 steps.
//   - The cache rows are copied as they are (576 bytes): 5 column blocks a slot,
//     the rope block half used. 8-bit wgmma takes both shared-memory operands
//     K-major only, which QK's are (S = Q K^T, 18 x m64n64k32).
//   - PV is computed transposed, O^T = V^T P^T: V^T is the A operand, loaded from
//     the slot into registers by transposing ldmatrix (8 tokens x 16 dims each)
//     and byte permutes (kv_fp8.cuh's E4M3_*_OF_PAIR, four a load), which leave a thread
//     dims 2j, 2j + 1 (j = lane / 4) of tokens {2t, 2t+1, 8+2t, 9+2t} (t = lane %
//     4) in its k slots 4t .. 4t+3; P^T is the B operand, K-major = P as row-major
//     rows of e4m3 codes, stored with its tokens in that same order within each
//     32-token step (write_p). So O^T's rows are V dims (a warpgroup's 256 in 4 m64
//     blocks, 128 fp32 a thread as in the 16-bit kernel) and its columns the CTA's
//     64 rows: the O rescale takes each row's factor from shared memory (alpha).
//   - P (<= 2^LAZY_MAX_LOG2) is quantised to e4m3 for PV; l sums the unquantised P,
//     as in the mma.sync e4m3 path. v_scale is applied to O at the end.
// Per pair, warpgroup g: compute_qk over its own slot, logits_mask on edge tiles,
// the row max exchange, the lazy online softmax (write_p, alpha), one CTA barrier,
// the O^T rescale, compute_pv over the pair's two slots (V dims 256g ..), each
// followed by the refill of its V half with the tile SLOTS on.

#include "verify_attention_wgmma_e4m3_config.h"
#include "verify_attention_common.cuh"
#include "verify_attention_combine_stream.cuh"
#include "wgmma.cuh"
#include "verify_attention_tma.h"
#include "verify_attention_wgmma_common.cuh"

// Byte offsets in dynamic shared memory (codegen's WgmmaSmemLayout): Q at 0.
constexpr int SMEM_K = KD_SMEM_K;          // the two K slots
constexpr int SMEM_P = KD_SMEM_P;          // slot 0's P
constexpr int SMEM_P1 = KD_SMEM_P1;        // slot 1's P
constexpr int SMEM_RED = KD_SMEM_RED;      // [WGS][BLOCK_M] floats: row maxima, then row sums
constexpr int SMEM_SCALE = KD_SMEM_SCALE;  // [WGS][BLOCK_M] alpha | [BLOCK_M] Q row scales
constexpr int SMEM_BAR = KD_SMEM_BAR;      // [SLOTS][RANGES] mbarriers
constexpr int SMEM_ROWS = KD_SMEM_ROWS;    // [SLOTS][BLOCK_N] cache slot indices
constexpr int SMEM_WALK = KD_SMEM_WALK;

constexpr int WGS = THREADS / WG_THREADS;
constexpr int SLOTS = STAGES;            // K slots: SLOTS / 2 pairs in flight
constexpr int PAIR_SETS = SLOTS / 2;     // pair j runs on slots 2 (j % PAIR_SETS) and the one after
constexpr int S_TILES = BLOCK_N / 8;          // n8 tiles of S
constexpr int V_COLS = HEAD_DIM_V / WGS;      // a warpgroup's O columns (O^T rows)
constexpr int O_BLOCKS = V_COLS / 64;         // its m64 blocks of O^T
constexpr int ROPE_STEPS = (HEAD_DIM - HEAD_DIM_V) / 32;  // k32 steps with Q from registers
constexpr int PV_STEPS = BLOCK_N / 32;
constexpr int STAGE_STRIDE = HEAD_DIM_V + 4;  // floats a staged O row: a warp's 4 rows of 64 bytes in distinct banks
static_assert(IS_MLA && KV_FP8 && MMA_E4M3, "the wgmma e4m3 kernel: MLA over e4m3 caches");
static_assert(BLOCK_M == 64 && WARPS_M == 4 && WARP_ROWS == 16 && WGS == 2 && WARPS_N == WGS,
              "two warpgroups, each all 64 rows (wgmma m64)");
static_assert(BLOCK_N == 64 && (SLOTS == 2 || SLOTS == 4) && V_COLS == 256 && ROW_ELEMS == 128,
              "the MMA shapes, one slot per warpgroup and pair");
static_assert(HEAD_DIM == HEAD_DIM_V + 64 && HEAD_DIM_V == 2 * V_COLS, "MLA: 512 latent dims and 64 rope dims");
static_assert(SMEM_K == V_BLOCKS * Q_BLOCK_BYTES && SMEM_P == SMEM_K + SLOTS * K_SLOT_BYTES &&
                  SMEM_P1 == SMEM_P + BLOCK_M * ROW_BYTES && SMEM_RED >= SMEM_P1 + BLOCK_M * ROW_BYTES &&
                  SMEM_SCALE >= SMEM_RED + WGS * BLOCK_M * 4 && SMEM_BAR >= SMEM_SCALE + (WGS + 1) * BLOCK_M * 4 &&
                  SMEM_ROWS >= SMEM_BAR + SLOTS * RANGES * 8 && SMEM_WALK >= SMEM_ROWS + SLOTS * BLOCK_N * 4,
              "the generator's layout");
static_assert(BLOCK_M * STAGE_STRIDE * 4 <= SLOTS * K_SLOT_BYTES && CLUSTER_STASH_BYTES <= SLOTS * K_SLOT_BYTES,
              "O's rows staged, or a cluster's split stashed, in the K slots");
static_assert(SMEM_K % 1024 == 0 && K_SLOT_BYTES % 1024 == 0 && SMEM_P % 1024 == 0 && SMEM_P1 % 1024 == 0,
              "swizzle atoms are 1024-aligned");
static_assert(SMEM_BAR % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(BLOCK_N % KV_TMA_BOX_ROWS == 0, "whole TMA boxes per tile");
static_assert(sizeof(SegmentWalk) <= KDTREE_SEGMENT_WALK_BYTES && SMEM_WALK % 8 == 0, "the walk's bytes");
static_assert((THREADS + 2) * 8 <= SMEM_K, "the stream-K scan runs in Q's space before Q is loaded");

// ---- Q, quantised.

// Q's rows as e4m3 codes: the latent dims into shared memory (V_BLOCKS column
// blocks), each row's scale (amax / 448 over its 576 dims; 1 for a zero row, whose
// codes are 0) to q_scale. A row is 8 consecutive lanes; lane u of them takes
// 16-dim unit u of each block and rope dims 8u .. 8u+7 (for the max). Rows past
// rows_total are zero. Plain stores: the caller fences (async proxy) and synchronises.
static __device__ __forceinline__ void load_q_e4m3(const kdtree_verify_params& p, const Request& req, int row0,
                                                   int rows_total, kd_u32 sq, float* q_scale) {
  const int unit = threadIdx.x % 8;
  for (int r = threadIdx.x / 8; r < BLOCK_M; r += THREADS / 8) {
    const int gr = row0 + r;
    const bool ok = gr < rows_total;
    const uint4* src = (const uint4*)((const kd_u16*)p.q + (ok ? out_row(p, req.node_base, gr, 0) : 0) * HEAD_DIM);
    uint4 w[V_BLOCKS][2];
    float amax = 0.f;
#pragma unroll
    for (int c = 0; c < V_BLOCKS; ++c) {
#pragma unroll
      for (int i = 0; i < 2; ++i) w[c][i] = ok ? __ldg(src + (c * ROW_ELEMS + unit * 16) / 8 + i) : make_uint4(0u, 0u, 0u, 0u);
    }
    const uint4 rope = ok ? __ldg(src + (HEAD_DIM_V + unit * 8) / 8) : make_uint4(0u, 0u, 0u, 0u);
    auto amax_of = [&](const uint4& v) {
      const kd_u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(kd_16_to_float(x[e / 2] >> (16 * (e % 2)))));
    };
#pragma unroll
    for (int c = 0; c < V_BLOCKS; ++c) {
      amax_of(w[c][0]);
      amax_of(w[c][1]);
    }
    amax_of(rope);
#pragma unroll
    for (int o = 1; o < 8; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
    const float inv = 1.f / scale;
    if (unit == 0) q_scale[r] = scale;
#pragma unroll
    for (int c = 0; c < V_BLOCKS; ++c) {
      kd_u32 code[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const kd_u32 x[4] = {w[c][i].x, w[c][i].y, w[c][i].z, w[c][i].w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          code[2 * i + h] = kd_e4m3x4_pack(kd_16_to_float(x[2 * h]) * inv, kd_16_to_float(x[2 * h] >> 16) * inv,
                                           kd_16_to_float(x[2 * h + 1]) * inv, kd_16_to_float(x[2 * h + 1] >> 16) * inv);
        }
      }
      asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(sq + c * Q_BLOCK_BYTES + sw128(r, unit)),
                   "r"(code[0]), "r"(code[1]), "r"(code[2]), "r"(code[3])
                   : "memory");
    }
  }
}

// Q's rope dims of this thread's two rows as the A fragments of the rope k32 steps
// (kd_wgmma_m64n64k32_e4m3_rs): qr[k][h] row r_lo + 8h, dims 32k + 4t .. + 3 of the
// rope, qr[k][2 + h] the same 16 dims on: loaded with Q's latent dims
// (load_q_rope_raw), quantised once the rows' scales are known (pack_q_rope).
using QRopeRaw = uint2[2][ROPE_STEPS][2];  // [row half h][k][16-dim half]
static __device__ __forceinline__ void load_q_rope_raw(const kdtree_verify_params& p, const Request& req, int row0,
                                                       int rows_total, int r_lo, QRopeRaw& raw) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = row0 + r_lo + 8 * h;
    const bool ok = gr < rows_total;
    const uint2* src = (const uint2*)((const kd_u16*)p.q + (ok ? out_row(p, req.node_base, gr, 0) : 0) * HEAD_DIM +
                                      HEAD_DIM_V + (lane % 4) * 4);
#pragma unroll
    for (int k = 0; k < ROPE_STEPS; ++k) {
#pragma unroll
      for (int half = 0; half < 2; ++half) raw[h][k][half] = ok ? __ldg(src + (k * 32 + half * 16) / 4) : make_uint2(0u, 0u);
    }
  }
}
static __device__ __forceinline__ void pack_q_rope(const QRopeRaw& raw, const float (&inv_scale)[2],
                                                   kd_u32 (&qr)[ROPE_STEPS][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int k = 0; k < ROPE_STEPS; ++k) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint2 v = raw[h][k][half];
        const float s = inv_scale[h];
        qr[k][2 * half + h] = kd_e4m3x4_pack(kd_16_to_float(v.x) * s, kd_16_to_float(v.x >> 16) * s,
                                             kd_16_to_float(v.y) * s, kd_16_to_float(v.y >> 16) * s);
      }
    }
  }
}

// ---- compute_qk: S = Q K^T over all 576 dims of a slot (codes; the scales are
// the softmax's): the rope steps with A from registers first, then the latent ones
// from shared memory, 4 k32 steps (32 bytes each) per 128-dim column block. Each
// column range is waited for just before its steps. Committed, not waited.
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
    kd_wgmma_m64n64k32_e4m3_rs(s, qr[k], b, k > 0);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    wait_range(bars + r * 8, parity);
#pragma unroll
    for (int ks = range_lo(r) * 4; ks < range_hi(r) * 4; ++ks) {
      const kd_u64 a = a0 + (kd_u64)(((ks / 4) * Q_BLOCK_BYTES + (ks % 4) * 32) >> 4);
      const kd_u64 b = b0 + (kd_u64)(((ks / 4) * K_BLOCK_BYTES + (ks % 4) * 32) >> 4);
      kd_wgmma_m64n64k32_e4m3(s, a, b, true);
    }
  }
  kd_wgmma_commit();
}

// ---- P: a row half's 16 values (token 8 jt + 2t + e of the tile in pv[jt][e]) as
// e4m3 codes into its row of the P tile, tokens in the V^T fragments' k order:
// within 32-token step kk, tokens 8 jt' + 2t + e (jt' = jt % 4) go to byte
// 16 (jt' / 2) + 4t + 2 (jt' % 2) + e, so one word per pair of n8 tiles.
static __device__ __forceinline__ void write_p(kd_u32 sp, int r, const float (&pv)[S_TILES][2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int jt = 4 * kk + 2 * half;
      const kd_u32 word = kd_e4m3x4_pack(pv[jt][0], pv[jt][1], pv[jt + 1][0], pv[jt + 1][1]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sp + sw128(r, 2 * kk + half) + 4 * t), "r"(word) : "memory");
    }
  }
}

// ---- compute_pv: O^T[this warpgroup's 256 dims] += V^T P^T over one slot. A: V^T
// in registers (vt_fragment; this warp's 16 dims of each m64 block), B: the slot's
// P tile (K-major: a row's 64 token codes, 32 bytes a k32 step). Committed, not waited.
static __device__ __forceinline__ void vt_fragment(kd_u32 (&a)[4], kd_u32 slot, int dim0, int tok0) {
  const int lane = threadIdx.x % 32;
  const int t = tok0 + lane;  // lanes 8i .. 8i+7 address matrix i: tokens tok0 + 8i ..
  kd_u32 r[4];
  kd_ldmatrix_x4_trans(r, slot + (dim0 / ROW_ELEMS) * K_BLOCK_BYTES + sw128(t, (dim0 % ROW_ELEMS) / 16));
  a[0] = __byte_perm(r[0], r[1], E4M3_EVEN_OF_PAIR);  // dim 2j: tokens 2t, 2t+1, 8+2t, 9+2t
  a[1] = __byte_perm(r[0], r[1], E4M3_ODD_OF_PAIR);   // dim 2j + 1
  a[2] = __byte_perm(r[2], r[3], E4M3_EVEN_OF_PAIR);  // the same 16 tokens on
  a[3] = __byte_perm(r[2], r[3], E4M3_ODD_OF_PAIR);
}
static __device__ __forceinline__ void compute_pv(float (&o)[O_BLOCKS][8][4], kd_u32 slot, kd_u32 sp, int wg) {
  const int w = (threadIdx.x / 32) % 4;
  kd_u32 a[PV_STEPS][O_BLOCKS][4];
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk) {
#pragma unroll
    for (int mb = 0; mb < O_BLOCKS; ++mb) vt_fragment(a[kk][mb], slot, wg * V_COLS + mb * 64 + w * 16, kk * 32);
  }
  const kd_u64 b0 = kd_wgmma_desc(sp, 16, 1024);
  kd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk) {
#pragma unroll
    for (int mb = 0; mb < O_BLOCKS; ++mb) kd_wgmma_m64n64k32_e4m3_rs(o[mb], a[kk][mb], b0 + (kd_u64)((kk * 32) >> 4), true);
  }
  kd_wgmma_commit();
}
static __device__ __forceinline__ void pin_o(float (&o)[O_BLOCKS][8][4]) {
#pragma unroll
  for (int mb = 0; mb < O_BLOCKS; ++mb) kd_wgmma_pin(o[mb]);
}

// ---- A segment's tile pairs and its rows, as warpgroup WG (a template parameter,
// so that ptxas sees no thread-dependent branch around a wgmma: it would serialise them).
template <int WG, bool CLUSTER>
static __device__ __forceinline__ void run_segment(const kdtree_verify_params& p, const kdtree_kv_tma& kv_tma,
                                                   const SegmentWalk& walk, const Request& req, const KvSource& kv_src,
                                                   int row0, int rows_total, int t_begin, int t_end,
                                                   int (&fills)[SLOTS], const kd_u32 (&qr)[ROPE_STEPS][4],
                                                   const float (&row_scale)[2], const kd_u64 (&words)[2][MASK_WORDS],
                                                   bool bad_page, kd_u32 sq, float* red, float* sc, float* stage) {
  const int wt = threadIdx.x % WG_THREADS;
  const int lane = threadIdx.x % 32;
  const int w = (threadIdx.x / 32) % 4;
  const int r_lo = w * 16 + lane / 4;  // this thread's S rows: r_lo and r_lo + 8
  const kd_u32 sk = sq + SMEM_K;
  const kd_u32 bar0 = sq + SMEM_BAR;  // slot s, range r at bar0 + (s * RANGES + r) * 8
  const kd_u32 my_p = sq + (WG == 0 ? SMEM_P : SMEM_P1);
  const kd_u32 rows0 = sq + SMEM_ROWS;  // slot s's row table at rows0 + s * BLOCK_N * 4
  float* alpha_tab = sc + WG * BLOCK_M;  // this warpgroup's copy of the rows' rescale factors
  const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;
  const int n_pairs = (n_tiles + 1) / 2;

  float o[O_BLOCKS][8][4];  // O^T: o[mb][i] rows (dims) 2j, 2j + 1 of the warp's 16, columns (rows) 8i + 2t, +1
#pragma unroll
  for (int mb = 0; mb < O_BLOCKS; ++mb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i][0] = o[mb][i][1] = o[mb][i][2] = o[mb][i][3] = 0.f;
  }
  float m_run[2] = {-KD_INF, -KD_INF}, l_run[2] = {0.f, 0.f};  // l: this thread's columns' share

#pragma unroll 1
  for (int j = 0; j < n_pairs; ++j) {
    const int my_tile = 2 * j + WG;
    const bool mine = my_tile < n_tiles;
    const bool has_1 = 2 * j + 1 < n_tiles;  // slot 1's tile of this pair
    // This pair's slots (tile 2j in s0, 2j + 1 in s0 + 1), each filled once per PAIR_SETS pairs.
    const int set = j % PAIR_SETS, s0 = 2 * set;
    const int uses = j / PAIR_SETS;
    const kd_u32 parity0 = kd_u32((set ? fills[SLOTS - 2] : fills[0]) + uses) & 1u;
    const kd_u32 parity1 = kd_u32((set ? fills[SLOTS - 1] : fills[1]) + uses) & 1u;
    const kd_u32 slot0 = sk + s0 * K_SLOT_BYTES, slot1 = slot0 + K_SLOT_BYTES;
    const kd_u32 bars0 = bar0 + s0 * RANGES * 8, bars1 = bars0 + RANGES * 8;
    const kd_u32 rows_0 = rows0 + s0 * BLOCK_N * 4, rows_1 = rows_0 + BLOCK_N * 4;
    const kd_u32 my_slot = WG == 0 ? slot0 : slot1;
    const kd_u32 my_bars = WG == 0 ? bars0 : bars1;
    const kd_u32 my_rows = WG == 0 ? rows_0 : rows_1;
    const int t0 = t_begin + my_tile * BLOCK_N;

    float s[S_TILES][4];
    float mx[2] = {-KD_INF, -KD_INF};
    if (mine) {
      compute_qk(s, sq, my_slot, my_bars, WG == 0 ? parity0 : parity1, qr);
      kd_wgmma_wait<0>();
      kd_wgmma_pin(s);
      // The rope range is read by this QK only: the slot's next tile's rope starts now.
      if (my_tile + SLOTS < n_tiles)
        load_kv_range<2, true>(p, kv_src, t0 + SLOTS * BLOCK_N, t_end, my_slot, my_bars + 16, my_rows, wt, bad_page);

      logits_mask_row_max(s, t0, req, t_end, words, mx);
    }

    // ---- row max over both tiles of the pair (the rows' scales, positive, are the
    // softmax's: raw maxima compare as the scaled ones).
    exchange_row_max<WG>(mx, red, r_lo);

    // ---- P: the lazy online softmax of both rows (log2 domain), as e4m3 codes to
    // this slot's P tile; the rows' rescale factors to alpha_tab.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float alpha;
      const float m_use = lazy_max_update(mx[h], row_scale[h], m_run[h], l_run[h], alpha);
      if (lane % 4 == 0) alpha_tab[r_lo + 8 * h] = alpha;
      if (mine) {
        float pv[S_TILES][2];
#pragma unroll
        for (int jt = 0; jt < S_TILES; ++jt) {
          pv[jt][0] = lazy_exp(s[jt][2 * h], row_scale[h], m_use);
          pv[jt][1] = lazy_exp(s[jt][2 * h + 1], row_scale[h], m_use);
          l_run[h] += pv[jt][0] + pv[jt][1];
        }
        write_p(my_p, r_lo + 8 * h, pv);
      }
    }
    kd_fence_proxy_async();
    __syncthreads();  // both P tiles and the rescale factors are in shared memory

    // ---- O^T rescale (most pairs of a long prefix skip it): column 8i + 2t + e is row 8i + 2t + e.
    float alpha_c[8][2];
    bool rescale = false;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 a = *(const float2*)(alpha_tab + 8 * i + 2 * (lane % 4));
      alpha_c[i][0] = a.x;
      alpha_c[i][1] = a.y;
      rescale |= a.x != 1.f || a.y != 1.f;
    }
    if (rescale) {
#pragma unroll
      for (int mb = 0; mb < O_BLOCKS; ++mb) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          o[mb][i][0] *= alpha_c[i][0];
          o[mb][i][1] *= alpha_c[i][1];
          o[mb][i][2] *= alpha_c[i][0];
          o[mb][i][3] *= alpha_c[i][1];
        }
      }
    }

    // ---- compute_pv over slot 0, then slot 1, each followed by the refill of the V
    // half this warpgroup read (once its PV retired). Each slot's QK warpgroup has
    // waited for all its ranges; the other waits for the V half it reads. One slot's
    // V^T fragments at a time: both in flight would not leave ptxas the registers
    // to keep the MMAs asynchronous.
    pin_o(o);
    if (WG == 1) wait_range(bars0 + 1 * 8, parity0);
    compute_pv(o, slot0, sq + SMEM_P, WG);
    kd_wgmma_wait<0>();
    pin_o(o);
    if (2 * j + SLOTS < n_tiles) {
      const int tn = t_begin + (2 * j + SLOTS) * BLOCK_N;
      warpgroup_sync<WG>();  // every warp's V^T ldmatrix of this slot came before its refill
      if (WG == 0) fill_range<0, false>(p, kv_tma, kv_src, tn, t_end, slot0, bars0, rows_0, wt, bad_page);
      if (WG == 1) fill_range<1, false>(p, kv_tma, kv_src, tn, t_end, slot0, bars0 + 8, rows_0, wt, bad_page);
    }
    if (has_1) {
      if (WG == 0) wait_range(bars1, parity1);
      compute_pv(o, slot1, sq + SMEM_P1, WG);
      kd_wgmma_wait<0>();
      pin_o(o);
    }
    if (2 * j + 1 + SLOTS < n_tiles) {
      const int tn = t_begin + (2 * j + 1 + SLOTS) * BLOCK_N;
      warpgroup_sync<WG>();  // every warp's V^T ldmatrix of this slot came before its refill
      if (WG == 0) fill_range<0, false>(p, kv_tma, kv_src, tn, t_end, slot1, bars1, rows_1, wt, bad_page);
      if (WG == 1) fill_range<1, false>(p, kv_tma, kv_src, tn, t_end, slot1, bars1 + 8, rows_1, wt, bad_page);
    }
  }
#pragma unroll
  for (int sl = 0; sl < SLOTS; ++sl) fills[sl] += (n_tiles - sl + SLOTS - 1) / SLOTS;  // the tiles slot sl took

  // ---- row sums over the row's 4 lanes (red[WG]): a thread's O^T columns are
  // rows it holds no S of.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l_row = l_run[h];
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 1);
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
    if (lane % 4 == 0) red[WG * BLOCK_M + r_lo + 8 * h] = l_row;
  }

  // (Synchronises the CTA: both warpgroups' last PV has read its V^T from the slots.)
  const bool poisoned = bad_page_seen(p, bad_page);

  const int dim_lo = WG * V_COLS + w * 16 + 2 * (lane / 4);
  if constexpr (CLUSTER) {
    // ---- the rows as split partials in the idle K slots (O^T column 8i + 2t + e is
    // row 8i + 2t + e, as below; a warp's 4-byte stores to its 4 rows of CLUSTER_ROW
    // fall in distinct banks); verify_rows merges them.
    unsigned char* stash = (unsigned char*)stage;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * i + 2 * (lane % 4) + e;
        const float inv = cluster_row_factor(p, red, r);
        kd_u16* srow = (kd_u16*)stash + r * CLUSTER_ROW + dim_lo;
#pragma unroll
        for (int mb = 0; mb < O_BLOCKS; ++mb)
          *(kd_u32*)(srow + mb * 64) = kd_pack2<IS_BF16>(o[mb][i][e] * inv, o[mb][i][2 + e] * inv);
      }
    }
    cluster_stash_lse(stash, red, m_run, poisoned, r_lo, WG == 0 && lane % 4 == 0);
  } else {
    // ---- O staged as fp32 rows in the idle K slots: O^T column 8i + 2t + e is row
    // 8i + 2t + e, dims 2j and 2j + 1 (j = lane / 4) of each 16-dim warp slice. A
    // thread holds pieces of 16 rows, and writing them from registers took a per-row
    // epilogue unrolled 16 times (about 30 KB of SASS run once a segment: 11 us on the
    // H200, with or without its stores); from shared memory one warp writes a whole
    // row, and the epilogue takes 3.5 us.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* srow = stage + (8 * i + 2 * (lane % 4) + e) * STAGE_STRIDE + dim_lo;
#pragma unroll
        for (int mb = 0; mb < O_BLOCKS; ++mb) *(float2*)(srow + mb * 64) = make_float2(o[mb][i][e], o[mb][i][2 + e]);
      }
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
  float* sc = (float*)(smem_raw + SMEM_SCALE);
  float* q_scale = sc + WGS * BLOCK_M;
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
  int fills[SLOTS] = {};  // fills of each slot before the current segment: phase parities

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

    // The first pair's tiles (the slots start free), each range by its filler, then Q.
    bool bad_page = false;
    const KvSource kv_src = kv_source(p, sg.b, 0);  // MLA: K rows, V their first HEAD_DIM_V dims
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      if (s < n_tiles) {
        const kd_u32 slot = sk + s * K_SLOT_BYTES, bars = bar0 + s * RANGES * 8;
        const int t0 = t_begin + s * BLOCK_N;
        const kd_u32 rows = sq + SMEM_ROWS + s * BLOCK_N * 4;
        if (wg == 0) fill_range<0, true>(p, kv_tma, kv_src, t0, t_end, slot, bars, rows, wt, bad_page);
        if (wg == 1) fill_range<1, true>(p, kv_tma, kv_src, t0, t_end, slot, bars + 8, rows, wt, bad_page);
        if (wg == s % 2) load_kv_range<2, true>(p, kv_src, t0, t_end, slot, bars + 16, rows, wt, bad_page);
      }
    }
    // Q's rope dims and the rows' mask words load with its latent dims.
    QRopeRaw rope_raw;
    load_q_rope_raw(p, req, row0, rows_total, r_lo, rope_raw);
    kd_u64 words[2][MASK_WORDS];
    row_mask_words(p, req, row0, rows_total, r_lo, words);
    load_q_e4m3(p, req, row0, rows_total, sq, q_scale);
    kd_fence_proxy_async();
    __syncthreads();

    // This thread's two rows: scales and rope fragments.
    float row_scale[2], inv_scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float qs = q_scale[r_lo + 8 * h];
      row_scale[h] = p.scale_log2 * qs;
      inv_scale[h] = 1.f / qs;
    }
    kd_u32 qr[ROPE_STEPS][4];
    pack_q_rope(rope_raw, inv_scale, qr);

    if (wg == 0) {
      run_segment<0, CLUSTER>(p, kv_tma, walk, req, kv_src, row0, rows_total, t_begin, t_end, fills, qr, row_scale, words,
                     bad_page, sq, red, sc, stage);
    } else {
      run_segment<1, CLUSTER>(p, kv_tma, walk, req, kv_src, row0, rows_total, t_begin, t_end, fills, qr, row_scale, words,
                     bad_page, sq, red, sc, stage);
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
