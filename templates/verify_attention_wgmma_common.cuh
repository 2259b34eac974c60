// What the wgmma verify_attention kernels share (templates/verify_attention_wgmma.cu
// over 16-bit caches, verify_attention_wgmma_e4m3.cu over e4m3 ones): the KV copies
// and the row-max exchange (the tree mask: verify_attention_wgmma_rows.cuh).
//
// Copies: a K slot of
// BLOCK_N token rows in column blocks of 128-byte rows in wgmma's 128-byte swizzle
// (wgmma.cuh), 64 16-bit or 128 e4m3 dims a block, filled in three column ranges
// that complete on one mbarrier each: range 0 = V's first half, 1 = its second
// half, 2 = the rope (MLA: V is the first HEAD_DIM_V dims of the K row). Each range
// is refilled by the warpgroup that reads it last (the kernels say when).
#ifndef KDTREE_VERIFY_ATTENTION_WGMMA_COMMON_CUH
#define KDTREE_VERIFY_ATTENTION_WGMMA_COMMON_CUH

#include "verify_attention_common.cuh"
#include "verify_attention_tma.h"
#include "wgmma.cuh"
#include "verify_attention_wgmma_rows.cuh"

constexpr int WG_THREADS = 128;
constexpr int KV_TMA_BOX_ROWS = KD_KV_TMA_BOX_ROWS;  // rows per TMA box: min(page size, BLOCK_N)
// The V ranges' TMA boxes enter L2 evict-first over e4m3 caches (H200, graph us: mla B=64
// H=8 n=8 4K 70.1 -> 67.6, B=32 H=16 n=16 2K 62.8 -> 61.9; B=4 H=128 n=64 8K, whose 128 row
// tiles reread each request's KV, 740 -> 745); over 16-bit caches the hint cost B=64 0.5 us.
constexpr bool KV_TMA_EVICT_FIRST = KV_ELEM_BYTES == 1;
constexpr int RANGES = 3;
constexpr int ROW_ELEMS = ROW_BYTES / KV_ELEM_BYTES;      // cache values in it
constexpr int DIM_BLOCKS = (HEAD_DIM + ROW_ELEMS - 1) / ROW_ELEMS;  // column blocks of a K row
constexpr int V_BLOCKS = HEAD_DIM_V / ROW_ELEMS;          // of its V part
constexpr int ROPE_UNITS = (HEAD_DIM - HEAD_DIM_V) * KV_ELEM_BYTES / 16;  // 16-byte units of a row's rope
constexpr int Q_BLOCK_BYTES = BLOCK_M * ROW_BYTES;        // one column block of the Q tile
constexpr int K_BLOCK_BYTES = BLOCK_N * ROW_BYTES;        // of a K slot
constexpr int K_SLOT_BYTES = DIM_BLOCKS * K_BLOCK_BYTES;
static_assert(HEAD_DIM_V % (2 * ROW_ELEMS) == 0 && ROPE_UNITS <= 8, "V halves of whole blocks; the rope in one block");

// The column blocks of range r of a slot: V's two halves, then the rope.
static __host__ __device__ constexpr int range_lo(int r) { return r == 0 ? 0 : r == 1 ? V_BLOCKS / 2 : V_BLOCKS; }
static __host__ __device__ constexpr int range_hi(int r) { return r == 0 ? V_BLOCKS / 2 : r == 1 ? V_BLOCKS : DIM_BLOCKS; }

// 16-byte units a row of range r takes in each of its blocks (the rope's block may be part-filled).
static __host__ __device__ constexpr int range_units(int r) { return r == 2 ? ROPE_UNITS : 8; }

// Column range R of KV tile t0 .. t0 + BLOCK_N into a slot, by the 128 threads of
// one warpgroup (wt: the thread's index in it), whose completion then arrives on
// the range's mbarrier. Tokens at or past t_end are zero-filled (their scores are
// masked; 0 x 0 stays 0 in PV). A page id outside the cache sets bad_page and
// reads nothing.
// The slot's rows as cache slot indices (0xffffffff: zero-fill) are kept in shared
// memory (rows_tab): the rope copy, a tile's first, reads the page table and writes
// them (LOOKUP), and the V ranges' copies, issued once a PV retires, read them
// there instead of waiting on a page-table load.
template <int R, bool LOOKUP>
static __device__ __forceinline__ void load_kv_range(const kdtree_verify_params& p, const KvSource& src, int t0,
                                                     int t_end, kd_u32 slot, kd_u32 bar, kd_u32 rows_tab, int wt,
                                                     bool& bad_page) {
  constexpr int U = range_units(R);
  const int unit = wt % U;
  for (int row = wt / U; row < BLOCK_N; row += WG_THREADS / U) {
    kd_u32 kv_slot;
    if constexpr (LOOKUP) {
      const unsigned t = unsigned(t0 + row);
      const bool in_range = t < unsigned(t_end);
      const unsigned page = in_range ? unsigned(__ldg(src.pages + t / PAGE_SIZE)) : 0u;
      const bool ok = in_range && page < unsigned(p.num_pages);
      bad_page |= in_range && !ok;
      kv_slot = ok ? page * PAGE_SIZE + t % PAGE_SIZE : 0xffffffffu;
      if (R == 2 && unit == 0) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(rows_tab + row * 4), "r"(kv_slot) : "memory");
    } else {
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(kv_slot) : "r"(rows_tab + row * 4) : "memory");
    }
    const bool ok = kv_slot != 0xffffffffu;
    const char* krow = src.k_base + (ok ? (unsigned long long)kv_slot : 0ull) * src.k_slot_bytes + unit * 16;
    const kd_u32 dst = slot + sw128(row, unit);
#pragma unroll
    for (int c = range_lo(R); c < range_hi(R); ++c)
      kd_cp_async16(dst + c * K_BLOCK_BYTES, krow + c * ROW_BYTES, ok ? 16 : 0);
  }
  kd_cp_async_mbar_arrive(bar);
}

// The same for a whole tile (every row below t_end) by TMA (kdtree_kv_tma's
// descriptor: boxes of one column block x KV_TMA_BOX_ROWS rows, a page run each): warp 0 of
// the warpgroup issues the boxes once its first thread has told the mbarrier how
// many bytes to expect; every thread arrives, as for cp.async. Each box's first
// cache slot comes from rows_tab or (LOOKUP, a segment's first tiles and every rope
// range) the page table, looked up by warp 0's lanes alone (one a box); a bad page's
// rows read cache row 0 (the request is NaN-poisoned). The rope range (R 2, 16-bit
// rows: it fills its column block) sets bad_page for the tile and keeps each box's
// first cache slot in rows_tab for the tile's V refills, which then go by TMA too
// (the same whole tile). Warp 0 reads rows_tab before it arrives: the range's next writer waits on
// this mbarrier (the boxes' bytes order the read too, but compute-sanitizer's
// racecheck sees only the arrive).
template <int R, bool LOOKUP>
static __device__ __forceinline__ void load_kv_range_tma(const kdtree_verify_params& p, const kdtree_kv_tma& tma,
                                                         const KvSource& src, int t0, kd_u32 slot, kd_u32 bar,
                                                         kd_u32 rows_tab, int wt, bool& bad_page) {
  constexpr int BOXES = BLOCK_N / KV_TMA_BOX_ROWS;  // per column block
  constexpr int OPS = (range_hi(R) - range_lo(R)) * BOXES;
  constexpr int ROUNDS = (OPS + 31) / 32;  // of the issuing warp's lanes
  static_assert(R != 2 || (LOOKUP && ROPE_UNITS == 8), "the rope: a tile's first copy, of a whole column block");
  // Warp-uniform to ptxas (the shuffle), as the kernel's warpgroup index.
  const bool issuer = __shfl_sync(0xffffffffu, wt / 32, 0) == 0;
  kd_u32 kv_slot[ROUNDS];
  if (issuer) {
#pragma unroll
    for (int k = 0; k < ROUNDS; ++k) {
      const int b = min(k * 32 + wt, OPS - 1) % BOXES;
      if constexpr (LOOKUP) {
        const unsigned t = unsigned(t0 + b * KV_TMA_BOX_ROWS);
        const unsigned page = unsigned(__ldg(src.pages + t / PAGE_SIZE));
        const bool ok = page < unsigned(p.num_pages);
        kv_slot[k] = ok ? page * PAGE_SIZE + t % PAGE_SIZE : 0xffffffffu;
        if constexpr (R == 2) {  // the tile's rope, its first copy, flags the tile's pages for all its ranges
          bad_page |= !ok;
          if (k * 32 + wt < OPS)
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(rows_tab + b * KV_TMA_BOX_ROWS * 4), "r"(kv_slot[k]) : "memory");
        }
      } else {
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(kv_slot[k]) : "r"(rows_tab + b * KV_TMA_BOX_ROWS * 4) : "memory");
      }
    }
  }
  kd_mbar_arrive(bar, wt == 0, (range_hi(R) - range_lo(R)) * K_BLOCK_BYTES);
  if (issuer) {
    __syncwarp();  // the expected bytes are set before a box can complete
#pragma unroll
    for (int k = 0; k < ROUNDS; ++k) {
      const int i = min(k * 32 + wt, OPS - 1);
      const int c = range_lo(R) + i / BOXES, b = i % BOXES;
      kd_tma_load_2d<KV_TMA_EVICT_FIRST>(k * 32 + wt < OPS, slot + c * K_BLOCK_BYTES + b * KV_TMA_BOX_ROWS * ROW_BYTES,
                                         tma.map, c * ROW_ELEMS, kv_slot[k] == 0xffffffffu ? 0 : int(kv_slot[k]), bar);
    }
  }
}

// A range's copies: by TMA when the tile is whole and the host encoded the descriptor.
// LOOKUP: a segment's first tiles, whose cache slots are not in rows_tab yet, and the
// rope, a tile's first copy (16-bit rows; e4m3 rows copy their rope by load_kv_range).
template <int R, bool LOOKUP>
static __device__ __forceinline__ void fill_range(const kdtree_verify_params& p, const kdtree_kv_tma& tma,
                                                  const KvSource& src, int t0,
                                                  int t_end, kd_u32 slot, kd_u32 bar, kd_u32 rows_tab, int wt,
                                                  bool& bad_page) {
  if (tma.enabled && t0 + BLOCK_N <= t_end) {
    load_kv_range_tma<R, LOOKUP>(p, tma, src, t0, slot, bar, rows_tab, wt, bad_page);
  } else {
    load_kv_range<R, LOOKUP>(p, src, t0, t_end, slot, bar, rows_tab, wt, bad_page);
  }
}

// The 128 threads of warpgroup WG (named barrier 1 + WG; 0 is __syncthreads).
template <int WG>
static __device__ __forceinline__ void warpgroup_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(1 + WG), "n"(WG_THREADS) : "memory");
}

// Waits for a range's copies; the fence hands what the generic proxy (cp.async)
// wrote to the async proxy wgmma reads through.
static __device__ __forceinline__ void wait_range(kd_u32 bar, kd_u32 parity) {
  kd_mbar_wait(bar, parity);
  kd_fence_proxy_async();
}

// ---- The row maxima of a pair's two tiles (one per warpgroup) exchanged through
// shared memory (red: [2][BLOCK_M] floats); a CTA barrier.
template <int WG>
static __device__ __forceinline__ void exchange_row_max(float (&mx)[2], float* red, int r_lo) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (threadIdx.x % 4 == 0) red[WG * BLOCK_M + r_lo + 8 * h] = mx[h];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], red[(1 - WG) * BLOCK_M + r_lo + 8 * h]);
}

// ---- The epilogue's writes, once a segment's O is staged as fp32 rows of STRIDE
// floats in shared memory (stage: the idle K slots) and both warpgroups' row sums
// are in red[2][BLOCK_M]: a warp per row, 4 dims a lane, so a warp's store covers
// 256 contiguous bytes of one row (from the accumulator fragments, 2 dims of a row
// a thread, a 16-bit row went out in 4-byte pieces).
// 16-bit out and natural-log LSE, or a split's / stream-K slot's 16-bit partials and
// log2-domain LSE, as write_row; e4m3 caches scale O by v_scale. m_run: the
// reference max of this thread's rows r_lo and r_lo + 8; lse_thread: one thread
// per row pair writes their LSEs.
template <int STRIDE>
static __device__ __forceinline__ void write_staged_rows(const kdtree_verify_params& p, const SegmentWalk& walk,
                                                         const Request& req, int row0, int rows_total,
                                                         const float* stage, const float* red,
                                                         const float (&m_run)[2], bool poisoned, int r_lo,
                                                         bool lse_thread) {
  static_assert(STRIDE >= HEAD_DIM_V && STRIDE % 4 == 0 && HEAD_DIM_V % 128 == 0, "float4 units of whole rows");
  const int lane = threadIdx.x % 32;
  const Segment target = segment_target(walk);
  const bool partial = target.partial_split >= 0 || target.partial_slot >= 0;
#pragma unroll 1
  for (int r = threadIdx.x / 32; r < BLOCK_M && row0 + r < rows_total; r += THREADS / 32) {
    const float l = red[r] + red[BLOCK_M + r];
    float inv = l > 0.f ? 1.f / l : 0.f;
    if (poisoned) inv = KD_NAN;
    if (!partial && l == 0.f && !poisoned) inv = KD_NAN;  // no visible token: a malformed mask
    if constexpr (KV_FP8) inv *= p.v_scale;
    const long long orow = out_row(p, req.node_base, row0 + r, 0);
    const float* srow = stage + r * STRIDE;
    kd_u16* dst = partial ? (kd_u16*)p.partial_o + partial_row(p, target, r, orow) * HEAD_DIM_V
                          : (kd_u16*)p.out + orow * HEAD_DIM_V;
#pragma unroll
    for (int c = lane * 4; c < HEAD_DIM_V; c += 128) {
      const float4 v = *(const float4*)(srow + c);
      *(uint2*)(dst + c) = make_uint2(kd_pack2<IS_BF16>(v.x * inv, v.y * inv), kd_pack2<IS_BF16>(v.z * inv, v.w * inv));
    }
  }
  kd_fence_proxy_async();  // these reads of the slots before the next segment's copies into them
  if (lse_thread) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r_lo + 8 * h;
      const int gr = row0 + r;
      if (gr >= rows_total) continue;
      const float l = red[r] + red[BLOCK_M + r];
      float lse2 = l > 0.f ? m_run[h] + kd_log2(l) : -KD_INF;
      if (poisoned) lse2 = KD_NAN;
      const long long orow = out_row(p, req.node_base, gr, 0);
      if (partial) {
        p.partial_lse[partial_row(p, target, r, orow)] = lse2;
      } else if (p.lse) {
        p.lse[orow] = lse2 * 0.69314718055994531f;
      }
    }
  }
}

// ---- Splits merged in a thread-block cluster (the kdtree_verify_attention_cluster
// entries; verify_attention_common.cuh): in place of staging O for
// write_staged_rows, a split stashes its rows as split partials in the idle K slots
// (16-bit, each row times cluster_row_factor) and their LSEs (cluster_stash_lse),
// then cluster_merge merges them across the cluster.

// Row r's factor: 1 / its sum over both warpgroups (and v_scale for e4m3 caches); 0
// for a row with nothing visible, whose LSE -inf gives it no weight.
static __device__ __forceinline__ float cluster_row_factor(const kdtree_verify_params& p, const float* red, int r) {
  const float l = red[r] + red[BLOCK_M + r];
  float inv = l > 0.f ? 1.f / l : 0.f;
  if constexpr (KV_FP8) inv *= p.v_scale;
  return inv;
}

// The log2-domain LSEs of rows r_lo and r_lo + 8, by the thread that holds their
// reference maxima m_run (lse_thread: one per row pair); NaN for a poisoned segment.
static __device__ __forceinline__ void cluster_stash_lse(unsigned char* stash, const float* red,
                                                         const float (&m_run)[2], bool poisoned, int r_lo,
                                                         bool lse_thread) {
  if (!lse_thread) return;
  float* lse = (float*)(stash + CLUSTER_LSE);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r_lo + 8 * h;
    const float l = red[r] + red[BLOCK_M + r];
    lse[r] = poisoned ? KD_NAN : (l > 0.f ? m_run[h] + kd_log2(l) : -KD_INF);
  }
}

#endif  // KDTREE_VERIFY_ATTENTION_WGMMA_COMMON_CUH
