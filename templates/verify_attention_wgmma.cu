// verify_attention_wgmma: MLA tree attention on Hopper's warpgroup MMA (sm_90a).
// The contract, the segment walk (uniform splits or stream-K) and the combine are
// verify_attention.cu's and verify_attention_qsplit.cu's; what differs is where
// the operands live. mma.sync on Hopper reads both operands through ldmatrix and
// is capped by the shared-memory port at about 40% of the tensor rate; wgmma reads
// them from shared memory by descriptor, so no warp loads a fragment.
//
// A CTA owns BLOCK_M = 64 rows (node x head) of one request and runs two
// warpgroups over them (wgmma's m64: a warpgroup's four warps hold 16 rows each).
// Shared memory holds the Q tile, two stages of 64 K rows (MLA: V is the first 512
// dims of the same rows) and P, each in 64-dim column blocks of 128-byte swizzled
// rows (wgmma.cuh). Per KV tile of BLOCK_N = 64 tokens:
//   compute_qk       warpgroup g: S_g = Q K[32g .. 32g + 32)^T, m64n32k16 x 36
//   logits_mask      edge tiles only (is_edge_tile)
//   row max          exchanged between the warpgroups through shared memory; both
//                    then run the same lazy online-softmax update, so they agree
//                    on every row's reference max and O rescale factor
//   P                exp2 of the scaled scores, to shared memory as 16-bit values
//   compute_pv       warpgroup g: O_g = alpha O_g + P V[:, 256g .. 256g + 256),
//                    m64n256k16 x 4, left running into the next tile's QK
// The next tile's copies start once every warpgroup has waited for the previous
// PV (the row-max barrier), into the stage that PV read.

#include "verify_attention_wgmma_config.h"
#include "verify_attention_common.cuh"
#include "verify_attention_combine_stream.cuh"
#include "wgmma.cuh"

// Byte offsets in dynamic shared memory (codegen's WgmmaSmemLayout): Q at 0.
constexpr int SMEM_K = KD_SMEM_K;
constexpr int SMEM_P = KD_SMEM_P;
constexpr int SMEM_RED = KD_SMEM_RED;  // [WGS][BLOCK_M] floats
constexpr int SMEM_WALK = KD_SMEM_WALK;

constexpr int WG_THREADS = 128;
constexpr int WGS = THREADS / WG_THREADS;
constexpr int ROW_BYTES = 128;                      // a swizzled row: 64 16-bit values
constexpr int DIM_BLOCKS = HEAD_DIM / 64;           // column blocks of a Q / K row
constexpr int Q_BLOCK_BYTES = BLOCK_M * ROW_BYTES;  // one column block of the Q tile
constexpr int K_BLOCK_BYTES = BLOCK_N * ROW_BYTES;  // of a K stage
constexpr int K_STAGE_BYTES = DIM_BLOCKS * K_BLOCK_BYTES;
constexpr int S_COLS = BLOCK_N / WGS;  // a warpgroup's tokens of the tile
constexpr int S_TILES = S_COLS / 8;    // its n8 tiles of S
constexpr int V_COLS = HEAD_DIM_V / WGS;
constexpr int O_TILES = V_COLS / 8;
constexpr int QK_STEPS = HEAD_DIM / 16;
constexpr int PV_STEPS = BLOCK_N / 16;
static_assert(IS_MLA && !KV_FP8, "the wgmma family: MLA over 16-bit caches");
static_assert(BLOCK_M == 64 && WARPS_M == 4 && WARP_ROWS == 16 && WGS == 2 && WARPS_N == WGS,
              "two warpgroups, each all 64 rows (wgmma m64)");
static_assert(BLOCK_N == 64 && S_COLS == 32 && V_COLS == 256 && STAGES == 2, "the MMA shapes of wgmma.cuh");
static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM_V == 4 * 64 * WGS, "whole column blocks");
static_assert(SMEM_K == DIM_BLOCKS * Q_BLOCK_BYTES && SMEM_P == SMEM_K + STAGES * K_STAGE_BYTES &&
                  SMEM_RED >= SMEM_P + BLOCK_M * ROW_BYTES && SMEM_WALK >= SMEM_RED + WGS * BLOCK_M * 4,
              "the generator's layout");
static_assert(SMEM_K % 1024 == 0 && K_STAGE_BYTES % 1024 == 0 && SMEM_P % 1024 == 0, "swizzle atoms are 1024-aligned");
static_assert(sizeof(SegmentWalk) <= KDTREE_SEGMENT_WALK_BYTES && SMEM_WALK % 8 == 0, "the walk's bytes");
static_assert((THREADS + 2) * 8 <= SMEM_K, "the stream-K scan runs in Q's space before Q is loaded");

// Byte offset of 16-byte unit u of row r in a column block of swizzled rows.
static __device__ __forceinline__ kd_u32 sw128(int r, int u) { return r * ROW_BYTES + ((u ^ (r & 7)) << 4); }

// ---- Copies. A row is 8 threads, one 16-byte unit of each 128-byte column block
// apiece, so a row costs one address computation and DIM_BLOCKS cp.async.

// The Q tile: BLOCK_M rows from row0 of the request's rows; rows past rows_total
// are zero-filled (their results are dropped).
static __device__ __forceinline__ void load_q_tile_sw128(const kdtree_verify_params& p, const Request& req, int row0,
                                                         int rows_total, kd_u32 sq) {
  const int unit = threadIdx.x % 8;
  for (int r = threadIdx.x / 8; r < BLOCK_M; r += THREADS / 8) {
    const int gr = row0 + r;
    const bool ok = gr < rows_total;
    const kd_u16* src = (const kd_u16*)p.q + (ok ? out_row(p, req.node_base, gr, 0) : 0) * HEAD_DIM + unit * 8;
    const kd_u32 dst = sq + sw128(r, unit);
#pragma unroll
    for (int c = 0; c < DIM_BLOCKS; ++c) kd_cp_async16(dst + c * Q_BLOCK_BYTES, src + c * 64, ok ? 16 : 0);
  }
}

// KV tokens t0 .. t0 + BLOCK_N into a stage; tokens at or past t_end are
// zero-filled (their scores are masked; 0 x 0 stays 0 in PV). A page id outside
// the cache sets bad_page and reads nothing.
static __device__ __forceinline__ void load_kv_tile_sw128(const kdtree_verify_params& p, const KvSource& src, int t0,
                                                          int t_end, kd_u32 sk, bool& bad_page) {
  const int unit = threadIdx.x % 8;
  for (int row = threadIdx.x / 8; row < BLOCK_N; row += THREADS / 8) {
    const unsigned t = unsigned(t0 + row);
    const bool in_range = t < unsigned(t_end);
    const unsigned page = in_range ? unsigned(__ldg(src.pages + t / PAGE_SIZE)) : 0u;
    const bool ok = in_range && page < unsigned(p.num_pages);
    bad_page |= in_range && !ok;
    const unsigned long long slot = ok ? (unsigned long long)(page * PAGE_SIZE + t % PAGE_SIZE) : 0ull;
    const char* krow = src.k_base + slot * src.k_slot_bytes + unit * 16;
    const kd_u32 dst = sk + sw128(row, unit);
#pragma unroll
    for (int c = 0; c < DIM_BLOCKS; ++c) kd_cp_async16(dst + c * K_BLOCK_BYTES, krow + c * ROW_BYTES, ok ? 16 : 0);
  }
}

// ---- compute_qk: S_g over all 576 dims. A is Q (K-major), B this warpgroup's 32
// token rows of the stage (K-major); a k16 step is 32 bytes into a column block's rows.
static __device__ __forceinline__ void compute_qk(float (&s)[S_TILES][4], kd_u32 sq, kd_u32 tk, int wg) {
  const kd_u64 a0 = kd_wgmma_desc(sq, 16, 1024);
  const kd_u64 b0 = kd_wgmma_desc(tk + wg * S_COLS * ROW_BYTES, 16, 1024);
#pragma unroll
  for (int j = 0; j < S_TILES; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  kd_wgmma_pin(s);
  kd_wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < QK_STEPS; ++ks) {
    // Descriptor addresses are in 16-byte units: the offsets add to the low field.
    const kd_u64 a = a0 + (kd_u64)(((ks / 4) * Q_BLOCK_BYTES + (ks % 4) * 32) >> 4);
    const kd_u64 b = b0 + (kd_u64)(((ks / 4) * K_BLOCK_BYTES + (ks % 4) * 32) >> 4);
    kd_wgmma_m64n32k16<IS_BF16>(s, a, b, ks > 0);
  }
  kd_wgmma_commit();
}

// ---- compute_pv: O_g += P V[:, this warpgroup's 256 columns]. A is P (K-major:
// 64 rows of 64 tokens, one column block); B is V as it lies (MN-major): 16 token
// rows per step, 64-column blocks K_BLOCK_BYTES apart. Left in flight.
static __device__ __forceinline__ void compute_pv(float (&o)[O_TILES][4], kd_u32 sp, kd_u32 tk, int wg) {
  const kd_u64 a0 = kd_wgmma_desc(sp, 16, 1024);
  const kd_u64 b0 = kd_wgmma_desc(tk + wg * (V_COLS / 64) * K_BLOCK_BYTES, K_BLOCK_BYTES, 1024);
  kd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk) {
    kd_wgmma_m64n256k16_bt<IS_BF16>(o, a0 + (kd_u64)((kk * 32) >> 4), b0 + (kd_u64)((kk * 16 * ROW_BYTES) >> 4), true);
  }
  kd_wgmma_commit();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) kdtree_verify_attention(const kdtree_verify_params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  float* red = (float*)(smem_raw + SMEM_RED);  // [WGS][BLOCK_M]: row maxima, then row sums
  const kd_u32 sq = kd_smem_addr(smem_raw);
  const kd_u32 sk = sq + SMEM_K;
  const kd_u32 sp_addr = sq + SMEM_P;
  kd_u16* sp = (kd_u16*)(smem_raw + SMEM_P);

  const int wg = threadIdx.x / WG_THREADS;
  const int lane = threadIdx.x % 32;
  const int r_lo = ((threadIdx.x / 32) % 4) * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8

  SegmentWalk& walk = *(SegmentWalk*)(smem_raw + SMEM_WALK);
  walk_begin(p, walk, (long long*)smem_raw);
#pragma unroll 1
  for (bool first = true;; first = false) {
    __syncthreads();  // the last segment's reads of walk.seg and of shared memory are done
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
    const int t_end = min(req.kv_len, sg.t_end);
    if (t_begin >= t_end) continue;  // the combine skips splits past kv_len
    const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;

    // Q, then the first two tiles (the stages start free).
    bool bad_page = false;
    KvSource kv_src;
    kv_src.k_base = (const char*)p.k_cache;
    kv_src.v_base = kv_src.k_base;
    kv_src.k_slot_bytes = (unsigned long long)HEAD_DIM * 2;
    kv_src.v_slot_bytes = kv_src.k_slot_bytes;
    kv_src.pages = p.page_table + (long long)sg.b * p.max_pages_per_req;
    load_q_tile_sw128(p, req, row0, rows_total, sq);
    load_kv_tile_sw128(p, kv_src, t_begin, t_end, sk, bad_page);
    kd_cp_async_commit();
    if (n_tiles > 1) load_kv_tile_sw128(p, kv_src, t_begin + BLOCK_N, t_end, sk + K_STAGE_BYTES, bad_page);
    kd_cp_async_commit();

    // This thread's two rows: tree node (-1 past the rows) and mask words.
    kd_u64 words[2][MASK_WORDS];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int gr = row0 + r_lo + 8 * h;
      const long long node = gr < rows_total ? req.node_base + gr / p.group : -1;
#pragma unroll
      for (int w = 0; w < MASK_WORDS; ++w) words[h][w] = node >= 0 ? __ldg(p.tree_mask + node * MASK_WORDS + w) : 0ull;
    }

    float o[O_TILES][4];
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_run[2] = {-KD_INF, -KD_INF}, l_run[2] = {0.f, 0.f};  // l: this thread's columns' share

#pragma unroll 1
    for (int it = 0; it < n_tiles; ++it) {
      const kd_u32 tk = sk + (it % STAGES) * K_STAGE_BYTES;
      const int t0 = t_begin + it * BLOCK_N;
      // Tile it (and Q) landed: the first tile's group leaves the second's pending;
      // later there is one group in flight, this tile's.
      if (it == 0) {
        kd_cp_async_wait<1>();
      } else {
        kd_cp_async_wait<0>();
      }
      kd_fence_proxy_async();
      __syncthreads();

      float s[S_TILES][4];
      compute_qk(s, sq, tk, wg);
      kd_wgmma_wait<0>();  // S, and the previous tile's PV, are in registers
      kd_wgmma_pin(s);
      kd_wgmma_pin(o);

      // ---- logits_mask: prefix tokens visible; tree tokens by the mask bits; none past t_end.
      if (is_edge_tile(t0, req, t_end)) {
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = t0 + wg * S_COLS + j * 8 + (lane % 4) * 2 + (e & 1);
            if (!token_visible(t, t_end, req, words[e >> 1])) s[j][e] = -KD_INF;
          }
        }
      }

      // ---- row max over both warpgroups' columns (4 lanes a row, then shared memory).
      float mx[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = -KD_INF;
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) mx[h] = fmaxf(mx[h], fmaxf(s[j][2 * h], s[j][2 * h + 1]));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if (lane % 4 == 0) red[wg * BLOCK_M + r_lo + 8 * h] = mx[h];
      }
      __syncthreads();  // also: every warpgroup's PV of tile it - 1 is complete
#pragma unroll
      for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], red[(1 - wg) * BLOCK_M + r_lo + 8 * h]);

      // The stage tile it - 1 used is free: tile it + 1 goes there (tile 1 went in first).
      if (it >= 1 && it + 1 < n_tiles) {
        load_kv_tile_sw128(p, kv_src, t0 + BLOCK_N, t_end, sk + ((it + 1) % STAGES) * K_STAGE_BYTES, bad_page);
      }
      kd_cp_async_commit();

      // ---- P: the lazy online softmax of both rows (log2 domain), to shared memory.
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_use = lazy_max_update(mx[h], p.scale_log2, m_run[h], l_run[h], alpha[h]);
        const int r = r_lo + 8 * h;
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
          const float p0 = lazy_exp(s[j][2 * h], p.scale_log2, m_use);
          const float p1 = lazy_exp(s[j][2 * h + 1], p.scale_log2, m_use);
          l_run[h] += p0 + p1;
          const int col = wg * S_COLS + j * 8 + (lane % 4) * 2;
          *(kd_u32*)((unsigned char*)sp + sw128(r, col / 8) + (col % 8) * 2) = kd_pack2<IS_BF16>(p0, p1);
        }
      }
      kd_fence_proxy_async();
      __syncthreads();  // both warpgroups' P columns are in

      // ---- compute_pv (after the O rescale, which most tiles of a long prefix skip).
      if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int j = 0; j < O_TILES; ++j) {
          o[j][0] *= alpha[0];
          o[j][1] *= alpha[0];
          o[j][2] *= alpha[1];
          o[j][3] *= alpha[1];
        }
      }
      kd_wgmma_pin(o);
      compute_pv(o, sp_addr, tk, wg);
    }
    kd_wgmma_wait<0>();
    kd_wgmma_pin(o);

    // ---- row sums over the row's 4 lanes and both warpgroups.
    float l_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_row[h] = l_run[h];
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
      if (lane % 4 == 0) red[wg * BLOCK_M + r_lo + 8 * h] = l_row[h];
    }
    const bool poisoned = bad_page_seen(p, bad_page);

    // ---- writing rows (16-bit out and natural-log LSE, or a split's / stream-K
    // slot's fp32 partials and log2-domain LSE), as the other families.
    const Segment target = segment_target(walk);
    const bool partial = target.partial_split >= 0 || target.partial_slot >= 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r_lo + 8 * h;
      const int gr = row0 + r;
      if (gr >= rows_total) continue;
      const float l = l_row[h] + red[(1 - wg) * BLOCK_M + r];
      const long long orow = out_row(p, req.node_base, gr, 0);
      const long long prow = partial ? partial_row(p, target, r, orow) : -1;
      write_row(p, o, h, orow, prow, l, m_run[h], poisoned, wg * V_COLS + (lane % 4) * 2, wg == 0 && lane % 4 == 0);
    }
  }  // segments
}
