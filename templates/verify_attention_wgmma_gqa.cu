// verify_attention_wgmma_gqa: GQA tree attention (64-, 128- and 256-dim heads,
// 16-bit caches) on Hopper's warpgroup MMA (sm_90a). The contract, the uniform
// KV splits and the combine are verify_attention.cu's; the MMAs read Q and the
// K/V tiles from shared memory by descriptor (P from registers), so no warp loads
// an operand fragment through the shared-memory port that caps mma.sync on Hopper.
//
// A CTA owns BLOCK_M = 128 rows (node x query head of one KV head) of one request:
// two consumer warpgroups of 64 rows each (wgmma's m64), and a producer warpgroup
// that copies the K and V tiles (BLOCK_N tokens, all HEAD_DIM dims) into STAGES
// stages, a quarter of the rows a warp. The producer warpgroup gives its registers to the consumers
// (setmaxnreg): three warps per SM sub-partition would otherwise cap every thread
// at 168 registers, and a 256-dim head's O alone takes 128.
// Unlike MLA's kernels, whose two warpgroups share 64 rows and split the V columns,
// each warpgroup here owns its rows outright: no row max crosses warpgroups, and
// the only CTA barrier after the start is the one that ends the tiles. The stages are handed over by
// mbarriers, K's and V's apart (StageBars). Per tile, a consumer warpgroup runs
//   compute_qk     S = Q_g K^T (m64nBLOCK_Nk16 over HEAD_DIM / 16 steps, both
//                  operands K-major in shared memory)
//   logits_mask    edge tiles only (is_edge_tile), then the row maxima
//   softmax        the lazy online update; P to registers as PV's A fragments
//   compute_pv     O = alpha O + P V (m64nHEAD_DIMk16, V MN-major as it lies)
// with tile i's QK issued ahead of tile i - 1's PV, so that each warpgroup's softmax
// runs under its own PV (64- and 128-dim heads), and the other warpgroup's MMAs fill
// the tensor core too.
// Shared memory: Q | K stages | V stages | mbarriers, each
// operand in 64-dim column blocks of 128-byte swizzled rows (wgmma.cuh).

#include "verify_attention_wgmma_gqa_config.h"
#include "verify_attention_common.cuh"
#include "verify_attention_combine.cuh"
#include "wgmma.cuh"
#include "verify_attention_wgmma_rows.cuh"

constexpr int SMEM_K = KD_SMEM_K;
constexpr int SMEM_V = KD_SMEM_V;
constexpr int SMEM_BAR = KD_SMEM_BAR;  // [STAGES] each: K full, K empty, V full, V empty
constexpr int SMEM_RAW = KD_SMEM_RAW;  // e4m3 caches: [RAW_STAGES] tiles of cache bytes, K rows then V rows
constexpr int RAW_STAGES = KD_RAW_STAGES;
constexpr int RAW_SLOTS = RAW_STAGES > 0 ? RAW_STAGES : 1;  // (16-bit caches have none)

constexpr int WG_THREADS = 128;
constexpr int WGS = THREADS / WG_THREADS;  // consumer warpgroups; THREADS counts consumers only
// The registers a CTA launches with (384 threads x 168) are the pool setmaxnreg moves
// between its warpgroups: 128 x 56 + 256 x 224 is all of it (asking for more waits forever).
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
constexpr int DIM_BLOCKS = HEAD_DIM / 64;  // 64-dim column blocks of a row
constexpr int Q_BLOCK_BYTES = BLOCK_M * ROW_BYTES;
constexpr int KV_BLOCK_BYTES = BLOCK_N * ROW_BYTES;
constexpr int KV_TILE_BYTES = DIM_BLOCKS * KV_BLOCK_BYTES;
constexpr int S_TILES = BLOCK_N / 8;  // n8 tiles of S
constexpr int O_TILES = HEAD_DIM / 8;
constexpr int QK_STEPS = HEAD_DIM / 16;
constexpr int PV_STEPS = BLOCK_N / 16;
// A tile's softmax under the previous tile's PV, which keeps two P tiles live: not
// for 256-dim heads, whose O takes 128 of a consumer's 224 registers.
constexpr bool OVERLAP_PV = HEAD_DIM <= 128;
static_assert(!IS_MLA && !MMA_E4M3 && HEAD_DIM == HEAD_DIM_V, "the GQA wgmma kernel: K and V caches, 16-bit MMAs");
static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "PV's N is the head dim (wgmma.cuh's shapes)");
static_assert(BLOCK_N == 64 || BLOCK_N == 128, "QK's N is the tile (wgmma.cuh's shapes)");
static_assert(WARP_ROWS == 16 && WARPS_N == 1 && BLOCK_M == WGS * 64 && WGS == 2, "two warpgroups of 64 rows");
constexpr int RAW_ROWS_BYTES = BLOCK_N * HEAD_DIM;  // a tile's K (or V) rows in e4m3
static_assert(SMEM_K == BLOCK_M * HEAD_DIM * 2 && SMEM_V == SMEM_K + STAGES * KV_TILE_BYTES &&
                  SMEM_RAW == SMEM_V + STAGES * KV_TILE_BYTES &&
                  SMEM_BAR == SMEM_RAW + (KV_FP8 ? RAW_STAGES * 2 * RAW_ROWS_BYTES : 0) &&
                  (KV_FP8 ? RAW_STAGES == 1 || RAW_STAGES == 2 : RAW_STAGES == 0),
              "the generator's layout");
static_assert(SMEM_K % 1024 == 0 && KV_TILE_BYTES % 1024 == 0 && Q_BLOCK_BYTES % 1024 == 0, "swizzle atoms");

// The stages' mbarriers. K and V have their own, so that a stage's K is refilled as
// soon as its QK retired while its V still waits for the PV that follows the next QK.
// `full`: the producer warpgroup's copies landed (128 arrivals); `empty`: all 256
// consumer threads are past their MMA over it.
struct StageBars {
  kd_u32 base;
  __device__ kd_u32 k_full(int s) const { return base + s * 8; }
  __device__ kd_u32 k_empty(int s) const { return base + (STAGES + s) * 8; }
  __device__ kd_u32 v_full(int s) const { return base + (2 * STAGES + s) * 8; }
  __device__ kd_u32 v_empty(int s) const { return base + (3 * STAGES + s) * 8; }
};

// Waits for a stage's copies and hands what cp.async wrote to the async proxy wgmma reads through.
static __device__ __forceinline__ void wait_full(kd_u32 bar, int i) {
  kd_mbar_wait(bar, kd_u32(i / STAGES) & 1u);
  kd_fence_proxy_async();
}

// ---- Copies.

// Q's tile (BLOCK_M rows from row0; rows past rows_total zero-filled, their results
// dropped) by the consumer threads: a row is 8 threads, one 16-byte unit of each
// column block apiece. The caller commits and waits.
static __device__ __forceinline__ void load_q(const kdtree_verify_params& p, const Request& req, int row0,
                                              int rows_total, int kv_head, kd_u32 sq) {
  const int unit = threadIdx.x % 8;
  for (int r = threadIdx.x / 8; r < BLOCK_M; r += THREADS / 8) {
    const int gr = row0 + r;
    const bool ok = gr < rows_total;
    const kd_u16* src =
        (const kd_u16*)p.q + (ok ? out_row(p, req.node_base, gr, kv_head * p.group) : 0) * HEAD_DIM + unit * 8;
#pragma unroll
    for (int c = 0; c < DIM_BLOCKS; ++c) kd_cp_async16(sq + c * Q_BLOCK_BYTES + sw128(r, unit), src + c * 64, ok ? 16 : 0);
  }
}

// The producer warpgroup: its four warps each own a quarter of a tile's rows. Per tile,
// lane l of warp w looks up the cache slot of row w * PRODUCER_ROWS + l one tile ahead
// (the page-table load's latency hides under the wait for a free stage); a row is then
// copied by 8 lanes, one 16-byte unit of each column block apiece, its slot taken from
// the looking-up lane. Tokens at or past t_end are zero-filled (masked; 0 x 0 stays 0
// in PV); a page id outside the cache sets bad_page and reads nothing.
constexpr int PRODUCER_ROWS = BLOCK_N / 4;  // a producer warp's rows of a tile
static_assert(PRODUCER_ROWS <= 32 && PRODUCER_ROWS % 4 == 0, "one lookup per lane, four rows per copy step");

// This producer warp's first row of a tile.
static __device__ __forceinline__ int producer_row_base() { return (threadIdx.x / 32 % 4) * PRODUCER_ROWS; }

static __device__ __forceinline__ kd_u32 lookup_slot(const kdtree_verify_params& p, const KvSource& src, int t0,
                                                     int t_end, bool& bad_page) {
  const int lane = threadIdx.x % 32;
  const unsigned t = unsigned(t0 + producer_row_base() + lane);
  const bool in_range = lane < PRODUCER_ROWS && t < unsigned(t_end);
  const unsigned page = in_range ? unsigned(__ldg(src.pages + t / PAGE_SIZE)) : 0u;
  const bool ok = in_range && page < unsigned(p.num_pages);
  bad_page |= in_range && !ok;
  return ok ? page * PAGE_SIZE + t % PAGE_SIZE : 0xffffffffu;
}

// This warp's rows of one K or V tile (base: the cache at the KV head) into a stage,
// completing on its full barrier.
static __device__ __forceinline__ void produce_rows(const char* base, unsigned long long slot_bytes, kd_u32 slot,
                                                    kd_u32 stage, kd_u32 full) {
  const int lane = threadIdx.x % 32;
  const int unit = lane % 8;
  const int row_base = producer_row_base();
#pragma unroll
  for (int r = lane / 8; r < PRODUCER_ROWS; r += 4) {
    const kd_u32 s = __shfl_sync(0xffffffffu, slot, r);
    const bool ok = s != 0xffffffffu;
    const char* row = base + (ok ? (unsigned long long)s : 0ull) * slot_bytes + unit * 16;
#pragma unroll
    for (int c = 0; c < DIM_BLOCKS; ++c) {
      kd_cp_async16(stage + c * KV_BLOCK_BYTES + sw128(row_base + r, unit), row + c * ROW_BYTES, ok ? 16 : 0);
    }
  }
  kd_cp_async_mbar_arrive(full);
}

// ---- e4m3 caches: the producer dequantises. Its threads copy a tile's cache bytes (K rows,
// then V rows, as the cache holds them) RAW_STAGES tiles ahead by cp.async, and once a
// stage is free turn them into q's 16-bit type in the stage's swizzled rows (exact:
// kv_fp8.cuh); k_scale is in the score scale and v_scale on O, as in the other kernels.
// A thread reads back only the bytes it copied itself, so cp.async.wait_group is all
// the synchronisation the cache bytes need. A warp step is RAW_ROWS_PER_STEP rows of
// RAW_UNITS 16-byte units (16 codes each).
constexpr int RAW_UNITS = HEAD_DIM / 16;
constexpr int RAW_ROWS_PER_STEP = 32 / RAW_UNITS;
constexpr int RAW_STEPS = PRODUCER_ROWS / RAW_ROWS_PER_STEP;
static_assert(PRODUCER_ROWS % RAW_ROWS_PER_STEP == 0, "whole steps");

// The staging slot of tile i's cache bytes (K rows, then V rows).
static __device__ __forceinline__ kd_u32 raw_slot(kd_u32 sq, int i) {
  return sq + SMEM_RAW + (i % RAW_SLOTS) * 2 * RAW_ROWS_BYTES;
}

static __device__ __forceinline__ void produce_raw(const KvSource& src, kd_u32 slot, kd_u32 raw) {
  const int lane = threadIdx.x % 32;
  const int unit = lane % RAW_UNITS;
  const int row_base = producer_row_base();
#pragma unroll
  for (int j = 0; j < RAW_STEPS; ++j) {
    const int r = j * RAW_ROWS_PER_STEP + lane / RAW_UNITS;
    const kd_u32 s = __shfl_sync(0xffffffffu, slot, r);
    const bool ok = s != 0xffffffffu;
    const unsigned long long at = ok ? (unsigned long long)s : 0ull;
    const kd_u32 dst = raw + (row_base + r) * HEAD_DIM + unit * 16;
    kd_cp_async16(dst, src.k_base + at * src.k_slot_bytes + unit * 16, ok ? 16 : 0);
    kd_cp_async16(dst + RAW_ROWS_BYTES, src.v_base + at * src.v_slot_bytes + unit * 16, ok ? 16 : 0);
  }
}

// This thread's share of a tile's K or V codes (raw: their rows) into a stage, completing on
// its full barrier (what was written reaches wgmma's async proxy through the fence).
// A lane's 16 codes are two 16-byte units of the 16-bit row, in column block unit / 4. Eight
// lanes of a warp store one row's eight 16-byte units together, four in each of two column
// blocks a multiple of 128 bytes apart; with both blocks' lanes on the same units they would
// hit the same banks (a two-way conflict on every store: 4.4 M of the 22.9 M shared
// wavefronts of gqa128 B=4 n=64 8K on the H100, ncu). So the odd block's lanes store their
// second unit first, and each store's eight lanes cover the row's eight bank groups.
static __device__ __forceinline__ void dequantise_rows(kd_u32 raw, kd_u32 stage, kd_u32 full) {
  const int lane = threadIdx.x % 32;
  const int unit = lane % RAW_UNITS;
  const int row_base = producer_row_base();
  const int swap = (unit / 4) & 1;  // the odd column block's lanes: second unit first
  const kd_u32 from_hi = swap ? E4M3_FROM_B : 0u;
#pragma unroll
  for (int j = 0; j < RAW_STEPS; ++j) {
    const int row = row_base + j * RAW_ROWS_PER_STEP + lane / RAW_UNITS;
    kd_u32 w[4];  // codes of dims 16 unit + 4 k .. + 3: words 0, 1 the first unit's, 2, 3 the second's
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(raw + row * HEAD_DIM + unit * 16));
    const kd_u32 dst = stage + (unit / 4) * KV_BLOCK_BYTES;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      // store x writes unit 2 (unit % 4) + (x ^ swap): the words of the first unit (w[k]) or the second (w[k + 2])
      const kd_u32 pick = from_hi ^ (x ? E4M3_FROM_B : 0u);
      kd_u32 h[4];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        h[2 * k] = kd_e4m3x2_pick_to_16<IS_BF16>(w[k], w[k + 2], E4M3_BYTES_01 ^ pick);
        h[2 * k + 1] = kd_e4m3x2_pick_to_16<IS_BF16>(w[k], w[k + 2], E4M3_BYTES_23 ^ pick);
      }
      asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst + sw128(row, (unit % 4) * 2 + (x ^ swap))),
                   "r"(h[0]), "r"(h[1]), "r"(h[2]), "r"(h[3])
                   : "memory");
    }
  }
  kd_fence_proxy_async();
  kd_mbar_arrive(full, false, 0);
}

// ---- compute_qk: S = Q_g K^T over all HEAD_DIM dims (a k16 step is 32 bytes into a
// column block's rows). Committed, not waited. (A template, so that only the
// shape of this N is instantiated.)
template <int N_TILES>
static __device__ __forceinline__ void compute_qk(float (&s)[N_TILES][4], kd_u32 sq_g, kd_u32 sk) {
  const kd_u64 a0 = kd_wgmma_desc(sq_g, 16, 1024);
  const kd_u64 b0 = kd_wgmma_desc(sk, 16, 1024);
  kd_wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < QK_STEPS; ++ks) {
    const kd_u64 a = a0 + (kd_u64)(((ks / 4) * Q_BLOCK_BYTES + (ks % 4) * 32) >> 4);
    const kd_u64 b = b0 + (kd_u64)(((ks / 4) * KV_BLOCK_BYTES + (ks % 4) * 32) >> 4);
    if constexpr (N_TILES == 16) {
      kd_wgmma_m64n128k16<IS_BF16>(s, a, b, ks > 0);
    } else {
      kd_wgmma_m64n64k16<IS_BF16>(s, a, b, ks > 0);
    }
  }
  kd_wgmma_commit();
}

// ---- compute_pv: O += P V over one tile. B is V as it lies (MN-major): 16 token rows
// per step, 64-column blocks KV_BLOCK_BYTES apart. Committed, not waited.
template <int N_TILES>
static __device__ __forceinline__ void compute_pv(float (&o)[N_TILES][4], const kd_u32 (&pf)[PV_STEPS][4], kd_u32 sv) {
  const kd_u64 b0 = kd_wgmma_desc(sv, KV_BLOCK_BYTES, 1024);
  kd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < PV_STEPS; ++kk) {
    const kd_u64 b = b0 + (kd_u64)((kk * 16 * ROW_BYTES) >> 4);
    if constexpr (N_TILES == 32) {
      kd_wgmma_m64n256k16_bt_rs<IS_BF16>(o, pf[kk], b, true);
    } else if constexpr (N_TILES == 16) {
      kd_wgmma_m64n128k16_bt_rs<IS_BF16>(o, pf[kk], b, true);
    } else {
      kd_wgmma_m64n64k16_bt_rs<IS_BF16>(o, pf[kk], b, true);
    }
  }
  kd_wgmma_commit();
}

// ---- logits_mask and softmax of one tile's S (tile t0): the lazy online update (log2
// domain) of this thread's two rows, P to PV's A fragments, alpha the factor O takes.
template <int N_TILES>
static __device__ __forceinline__ void softmax_tile(const kdtree_verify_params& p, float (&s)[N_TILES][4], int t0,
                                                    const Request& req, int t_end, const kd_u64 (&words)[2][MASK_WORDS],
                                                    float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                                    kd_u32 (&pf)[PV_STEPS][4]) {
  float mx[2] = {-KD_INF, -KD_INF};
  logits_mask_row_max(s, t0, req, t_end, words, mx);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_use = lazy_max_update(mx[h], p.scale_log2, m_run[h], l_run[h], alpha[h]);
#pragma unroll
    for (int jt = 0; jt < N_TILES; ++jt) {
      const float p0 = lazy_exp(s[jt][2 * h], p.scale_log2, m_use);
      const float p1 = lazy_exp(s[jt][2 * h + 1], p.scale_log2, m_use);
      l_run[h] += p0 + p1;
      pf[jt / 2][(jt % 2) * 2 + h] = kd_pack2<IS_BF16>(p0, p1);
    }
  }
}

// ---- The segment's tiles and its rows, as consumer warpgroup WG (a template parameter,
// so that ptxas sees no thread-dependent branch around a wgmma: it would serialise them).
template <int WG>
static __device__ __forceinline__ void consume_segment(const kdtree_verify_params& p, const Segment& sg,
                                                       const Request& req, int row0, int rows_total, int t_begin,
                                                       int t_end, bool bad_page, kd_u32 sq, StageBars bars) {
  const int lane = threadIdx.x % 32;
  const int r_lo = ((threadIdx.x / 32) % 4) * 16 + lane / 4;  // this thread's rows in its warpgroup's 64
  const kd_u32 sq_g = sq + WG * 64 * ROW_BYTES;
  const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;

  kd_u64 words[2][MASK_WORDS];
  row_mask_words(p, req, row0 + WG * 64, rows_total, r_lo, words);

  float o[O_TILES][4];
#pragma unroll
  for (int j = 0; j < O_TILES; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-KD_INF, -KD_INF}, l_run[2] = {0.f, 0.f};  // l: this thread's columns' share

  // OVERLAP_PV: tile i's QK is issued before tile i - 1's PV, and its softmax runs while that PV
  // is on the tensor core (wgmma groups retire in order: waiting for all but the
  // newest group waits for the QK). P of two tiles is live meanwhile, in two
  // buffers (even tiles' and odd tiles'), never copied: a P written while a PV
  // reads the registers it came from would serialise the wgmmas.
  kd_u32 pf_even[PV_STEPS][4], pf_odd[PV_STEPS][4];
  {
    float s[S_TILES][4];
    wait_full(bars.k_full(0), 0);
    kd_wgmma_pin(s);
    compute_qk(s, sq_g, sq + SMEM_K);
    kd_wgmma_wait<0>();
    kd_wgmma_pin(s);
    kd_mbar_arrive(bars.k_empty(0), false, 0);
    float alpha[2];  // O is still 0
    softmax_tile(p, s, t_begin, req, t_end, words, m_run, l_run, alpha, pf_even);
  }
  // Tile i (>= 1): its QK, tile i - 1's PV (P in pf_in), its softmax into pf_out.
  auto step = [&](int i, const kd_u32(&pf_in)[PV_STEPS][4], kd_u32(&pf_out)[PV_STEPS][4]) {
    const int stage = i % STAGES, prev = (i - 1) % STAGES;
    if constexpr (!OVERLAP_PV) {
      wait_full(bars.v_full(prev), i - 1);
      compute_pv(o, pf_in, sq + SMEM_V + prev * KV_TILE_BYTES);
      kd_wgmma_wait<0>();
      kd_wgmma_pin(o);
      kd_mbar_arrive(bars.v_empty(prev), false, 0);
    }
    float s[S_TILES][4];
    wait_full(bars.k_full(stage), i);
    kd_wgmma_pin(s);
    compute_qk(s, sq_g, sq + SMEM_K + stage * KV_TILE_BYTES);
    if constexpr (OVERLAP_PV) {
      wait_full(bars.v_full(prev), i - 1);
      compute_pv(o, pf_in, sq + SMEM_V + prev * KV_TILE_BYTES);
      kd_wgmma_wait<1>();  // the QK
    } else {
      kd_wgmma_wait<0>();
    }
    kd_wgmma_pin(s);
    kd_mbar_arrive(bars.k_empty(stage), false, 0);
    float alpha[2];
    softmax_tile(p, s, t_begin + i * BLOCK_N, req, t_end, words, m_run, l_run, alpha, pf_out);
    if constexpr (OVERLAP_PV) {
      // ---- the previous tile's PV retired: its V stage is free, and O takes this tile's rescale.
      kd_wgmma_wait<0>();
      kd_wgmma_pin(o);
      kd_mbar_arrive(bars.v_empty(prev), false, 0);
    }
    if (alpha[0] != 1.f || alpha[1] != 1.f) {  // most tiles of a long prefix skip it
#pragma unroll
      for (int jt = 0; jt < O_TILES; ++jt) {
        o[jt][0] *= alpha[0];
        o[jt][1] *= alpha[0];
        o[jt][2] *= alpha[1];
        o[jt][3] *= alpha[1];
      }
    }
    kd_wgmma_pin(o);  // the rescale stays before the next PV
  };
  // Without the overlap, tile i - 1's PV has retired before tile i's P is written: one buffer.
  kd_u32(&pf_b)[PV_STEPS][4] = OVERLAP_PV ? pf_odd : pf_even;
#pragma unroll 1
  for (int i = 1; i < n_tiles; i += 2) {
    step(i, pf_even, pf_b);
    if (i + 1 < n_tiles) step(i + 1, pf_b, pf_even);
  }
  const int last = (n_tiles - 1) % STAGES;
  wait_full(bars.v_full(last), n_tiles - 1);
  if (n_tiles % 2 || !OVERLAP_PV) {
    compute_pv(o, pf_even, sq + SMEM_V + last * KV_TILE_BYTES);
  } else {
    compute_pv(o, pf_b, sq + SMEM_V + last * KV_TILE_BYTES);
  }
  kd_wgmma_wait<0>();
  kd_wgmma_pin(o);
  kd_mbar_arrive(bars.v_empty(last), false, 0);

  // ---- row sums over the row's 4 lanes.
  float l_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_row[h] = l_run[h];
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
  }
  const bool poisoned = bad_page_seen(p, bad_page);

  // ---- writing rows (16-bit out and natural-log LSE, or a split's 16-bit partials
  // and log2-domain LSE), as the other families.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = WG * 64 + r_lo + 8 * h;
    const int gr = row0 + r;
    if (gr >= rows_total) continue;
    const long long orow = out_row(p, req.node_base, gr, sg.kv_head * p.group);
    const long long prow = sg.partial_split >= 0 ? partial_row(p, sg, r, orow) : -1;
    write_row<O_TILES, false>(p, o, h, orow, prow, l_row[h], m_run[h], poisoned, (lane % 4) * 2, lane % 4 == 0);
  }
}

// ---- The CTA's one segment (uniform splits: its grid point) as one role: consumer
// warpgroup 0 or 1, or the producer warpgroup (ROLE == WGS). Each role has its own
// copy of the code, so what follows each setmaxnreg is that role's alone; the roles
// meet at one CTA barrier, bad_page_seen's after the tiles.
template <int ROLE>
static __device__ __forceinline__ void run_segment(const kdtree_verify_params& p, kd_u32 sq) {
  const StageBars bars{sq + SMEM_BAR};
  const Segment sg = grid_segment(p);
  const Request req = load_request(p, sg.b);
  if (!req.valid) {
    // Malformed request: the segment of each KV head's first row tile and split writes NaN to
    // its rows (the flag says why).
    if (ROLE < WGS && sg.m_tile == 0 && sg.t_begin == 0) {
      if (p.error_flags && threadIdx.x == 0) atomicOr(p.error_flags, request_errors(p, req));
      poison_request(p, req, sg.kv_head);
    }
    return;
  }
  const int rows_total = req.n_nodes * p.group;
  const int row0 = sg.m_tile * BLOCK_M;
  const int t_begin = sg.t_begin;
  const int t_end = min(req.kv_len, sg.t_end);
  // Rows past the request's, or a split past kv_len (the combine skips it): nothing to do.
  if (row0 >= rows_total || t_begin >= t_end) return;
  const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;

  bool bad_page = false;
  if constexpr (ROLE == WGS) {
    // ---- the producer warpgroup: each tile's K once its K stage is free, then its V.
    const KvSource src = kv_source(p, sg.b, sg.kv_head);
    kd_u32 slot = lookup_slot(p, src, t_begin, t_end, bad_page);
    if constexpr (KV_FP8) {
      // The next tile's cache bytes into the raw slot it takes (an empty group past the last tile,
      // so that wait_group's count stays RAW_STAGES - 1); its successor's slots looked up for later.
      int issued = 0;
      auto issue_raw = [&] {
        if (issued < n_tiles) {
          produce_raw(src, slot, raw_slot(sq, issued));
          ++issued;
          if (issued < n_tiles) slot = lookup_slot(p, src, t_begin + issued * BLOCK_N, t_end, bad_page);
        }
        kd_cp_async_commit();
      };
#pragma unroll
      for (int j = 0; j < RAW_STAGES; ++j) issue_raw();
#pragma unroll 1
      for (int i = 0; i < n_tiles; ++i) {
        const int stage = i % STAGES, fill = i / STAGES;
        const kd_u32 raw = raw_slot(sq, i);
        kd_cp_async_wait<RAW_SLOTS - 1>();  // tile i's bytes (this thread's) landed
        if (fill > 0) kd_mbar_wait(bars.k_empty(stage), kd_u32(fill - 1) & 1u);
        dequantise_rows(raw, sq + SMEM_K + stage * KV_TILE_BYTES, bars.k_full(stage));
        if (fill > 0) kd_mbar_wait(bars.v_empty(stage), kd_u32(fill - 1) & 1u);
        dequantise_rows(raw + RAW_ROWS_BYTES, sq + SMEM_V + stage * KV_TILE_BYTES, bars.v_full(stage));
        issue_raw();
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < n_tiles; ++i) {
        const int stage = i % STAGES, fill = i / STAGES;
        const kd_u32 next = i + 1 < n_tiles ? lookup_slot(p, src, t_begin + (i + 1) * BLOCK_N, t_end, bad_page) : 0u;
        if (fill > 0) kd_mbar_wait(bars.k_empty(stage), kd_u32(fill - 1) & 1u);
        produce_rows(src.k_base, src.k_slot_bytes, slot, sq + SMEM_K + stage * KV_TILE_BYTES, bars.k_full(stage));
        if (fill > 0) kd_mbar_wait(bars.v_empty(stage), kd_u32(fill - 1) & 1u);
        produce_rows(src.v_base, src.v_slot_bytes, slot, sq + SMEM_V + stage * KV_TILE_BYTES, bars.v_full(stage));
        slot = next;
      }
    }
    bad_page_seen(p, bad_page);  // the CTA barrier the consumers meet after their tiles
  } else {
    load_q(p, req, row0, rows_total, sg.kv_head, sq);
    kd_cp_async_commit();
    kd_cp_async_wait<0>();
    kd_fence_proxy_async();
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");  // Q is in shared memory for both warpgroups
    consume_segment<ROLE>(p, sg, req, row0, rows_total, t_begin, t_end, bad_page, sq, bars);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS + WG_THREADS, 1) kdtree_verify_attention(const kdtree_verify_params p) {
  kd_launch_dependents();  // the split combine may launch now; it waits for this grid's writes
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const kd_u32 sq = kd_smem_addr(smem_raw);
  if (threadIdx.x == 0) {
    const StageBars bars{sq + SMEM_BAR};
    for (int s = 0; s < STAGES; ++s) {
      kd_mbar_init(bars.k_full(s), WG_THREADS);  // the producer's threads, once their copies land
      kd_mbar_init(bars.k_empty(s), THREADS);    // every consumer thread, past its QK
      kd_mbar_init(bars.v_full(s), WG_THREADS);
      kd_mbar_init(bars.v_empty(s), THREADS);    // every consumer thread, past its PV
    }
  }
  __syncthreads();  // the mbarriers are initialised
  // Warp-uniform to ptxas by the shuffle: a wgmma under a branch it must treat as
  // divergent is serialised. Warpgroup WGS is the producer.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / WG_THREADS, 0);
  if (wg == WGS) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
    run_segment<WGS>(p, sq);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    if (wg == 0) {
      run_segment<0>(p, sq);
    } else {
      run_segment<1>(p, sq);
    }
  }
}
