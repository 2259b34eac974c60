// verify_attention_qsplit: MLA tree attention where shared memory cannot hold a
// 64-row Q tile beside the KV stages (sm_120 and sm_86/89: 99 KB per block). The
// contract, the split partials and kdtree_verify_combine are verify_attention.cu's.
//
// Q lives in registers. The CTA's BLOCK_M rows are WARPS_M warp rows of WARP_ROWS;
// the WARPS_N column warps of a warp row split Q's head dim (576 / 4 = 144 dims,
// 72 registers a thread) for S = Q K^T and the V columns (512 / 4 = 128) for
// O += P V. Shared memory holds the KV stages, the partial S tiles, P and per-row
// factors only. Per KV tile of BLOCK_N tokens:
//   compute_qk_partial  each warp: S_w = Q[rows, dims_w] K[tile, dims_w]^T, fp32, to shared memory
//   reduce_rows         each warp sums the WARPS_N partials of RED_ROWS of its warp
//                       row's rows, masks them and runs the online softmax of those
//                       rows alone: no row-max exchange between warps
//   (P and alpha)       bf16 P and each row's O rescale factor to shared memory
//   compute_pv          each warp: O[rows, cols_w] = alpha O + P V[tile, cols_w]
// One CTA barrier per tile guards the KV stage; the two exchanges inside a tile are
// named barriers of the warp row.
//
// e4m3 MMA path (MMA_E4M3, kv_fp8.cuh; the second half of this file): the same
// phases on m16n8k32 e4m3 MMAs with Q as e4m3 codes in registers, 32-token tiles
// and a reduction in the mma's own layout (see "The e4m3 MMA path" below).
//
// SKEW: the two warp rows run the phases in a different order. Row 0 runs QK,
// reduce, PV of tile t; row 1 runs PV of tile t - 1, then QK and reduce of tile t.
// Each scheduler holds one warp of each row, so while one row reduces (no tensor
// work) the other row's mma keep the tensor pipe busy. Row 1 reads stage t - 1
// after the tile barrier, so the copies run STAGES - 2 tiles ahead, not STAGES - 1.

#include "verify_attention_qsplit_config.h"
#include "verify_attention_common.cuh"
#include "verify_attention_combine_stream.cuh"

// Byte offsets in dynamic shared memory (codegen's QsplitSmemLayout): K stages at 0
// (Q is staged there first), partial S, P, per-row stats, the segment walk. The
// generator sizes the block for both uses.
constexpr int SMEM_PART_S = KD_SMEM_PART_S;
constexpr int SMEM_P = KD_SMEM_P;
constexpr int SMEM_STATS = KD_SMEM_STATS;  // [KDTREE_QSPLIT_STATS][BLOCK_M] floats
constexpr int SMEM_WALK = KD_SMEM_WALK;
constexpr int SMEM_Q_SCALE = KD_SMEM_Q_SCALE;  // the e4m3 MMA path: Q's row scales while Q is staged
// Q's staged tile: 16-bit rows, or (e4m3 MMA) e4m3 rows as the cache's with a scale per row after them.
constexpr int Q_STAGE_BYTES = MMA_E4M3 ? SMEM_Q_SCALE + BLOCK_M * 4 : BLOCK_M * HEAD_DIM * 2;
static_assert(!MMA_E4M3 || SMEM_Q_SCALE >= BLOCK_M * KV_K_ROW_CHUNKS * 16, "Q's row scales follow its e4m3 rows");
static_assert(SMEM_WALK >= SMEM_STATS + KDTREE_QSPLIT_STATS * BLOCK_M * 4 && SMEM_WALK >= Q_STAGE_BYTES,
              "the walk lies past the stats rows and past Q's staging, across which it is live");
static_assert(sizeof(SegmentWalk) <= KDTREE_SEGMENT_WALK_BYTES && SMEM_WALK % 8 == 0, "the walk's bytes");

constexpr int DIMS_W = HEAD_DIM / WARPS_N;  // Q/K dims of a column warp
constexpr int QK_STEPS_W = DIMS_W / 16;     // its k16 steps
constexpr int DIM_CHUNKS_W = DIMS_W / 8;    // its 16-byte chunks of a row
constexpr int DIM_GROUPS_W = DIMS_W / 16;   // e4m3 caches: its 16-byte chunks of a K row
static_assert(DIM_CHUNKS_W == 2 * DIM_GROUPS_W, "k_chunk0 / 2 is a column warp's first 16-dim group");
constexpr int S_TILES = BLOCK_N / 8;        // n8 tiles of a warp's partial S: every column of the tile
constexpr int V_COLS = HEAD_DIM_V / WARPS_N;
constexpr int O_TILES = V_COLS / 8;         // n8 tiles of O per warp
constexpr int PV_PAIRS = O_TILES / 2;       // ldmatrix.x4.trans per k16 slice of V
constexpr int RED_ROWS = WARP_ROWS / WARPS_N;  // rows a warp reduces and normalises
constexpr int RED_LANES = 32 / RED_ROWS;       // lanes of such a row
constexpr int RED_COLS = BLOCK_N / RED_LANES;  // columns of a lane
constexpr int PART_WARP_FLOATS = WARP_ROWS * BLOCK_N;  // one warp's partial S tile
constexpr int P_CHUNKS = BLOCK_N / 8;
constexpr int PREFETCH = STAGES - 2;  // KV tiles in flight ahead of the one computed (SKEW)
static_assert(WARPS_M == 2 && PREFETCH >= 1, "SKEW: an early and a late warp row; a stage for each");
static_assert(IS_MLA, "Q in registers is the layout for MLA's 576-wide rows");
static_assert(WARPS_N >= 2 && DIMS_W % 16 == 0, "column warps split Q's head dim in k16 steps");
static_assert(V_COLS % 64 == 0, "a column warp's V slice keeps whole swizzle groups");
// The partial-S and P swizzles below are for 16-token tiles of 8 rows per reducing warp
// (the 16-bit MMA path; the e4m3 one reduces in the mma layout, see below).
static_assert(MMA_E4M3 || (BLOCK_N == 16 && RED_ROWS == 8 && RED_COLS == 4), "tile shape of the row reduction");

// 16-byte chunk swizzles free of bank conflicts for both sides of each exchange:
// partial S (64-byte rows of 4 chunks) is written as float2 by the mma fragment
// layout and read as float4 by 4 lanes per row; P (32-byte rows of 2 chunks) is
// written as 4 values by 4 lanes per row and read by ldmatrix.
static __device__ __forceinline__ int part_chunk(int row, int chunk) { return chunk ^ (row & 2); }
static __device__ __forceinline__ int p_chunk(int row, int chunk) { return chunk ^ ((row >> 2) & 1); }

// A barrier of the WARPS_N * 32 threads of warp row wm (id 0 is __syncthreads).
static __device__ __forceinline__ void warp_row_barrier(int wm) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wm), "n"(WARPS_N * 32) : "memory");
}

// The KV hand-off between the warp rows (SKEW): a row arrives on the other row's
// barrier once its copies of a tile are complete, and waits on its own before
// reading the tile, so neither row waits for the other's softmax at a tile boundary.
template <int V>
struct Role {
  static constexpr int value = V;
};
constexpr int BAR_TO_EARLY = 3;  // row 1 arrives, row 0 waits
constexpr int BAR_TO_LATE = 4;   // row 0 arrives, row 1 waits
static __device__ __forceinline__ void kv_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
static __device__ __forceinline__ void kv_wait(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}

struct RowStats {  // of the row a lane reduces (the RED_LANES lanes of a row hold the same m)
  float m;  // reference max, log2 domain (see LAZY_MAX_LOG2)
  float l;  // this lane's share of the row sum
};

// ---- compute_pv: rescale O where a row's reference max moved (rarely, once the
// maxima settle), then O += P V over this warp's V columns. tv_addr: the tile's
// V (MLA: the K rows' first HEAD_DIM_V dims) at this warp's first column.
static __device__ __forceinline__ void compute_pv(float (&o)[MF][O_TILES][4], const float* salpha, kd_u32 p_lane,
                                                  kd_u32 tv_addr, const LaneRow<QK_CHUNKS>& v_lane, int wm, int lane) {
  float alpha[MF][2];
  bool rescale = false;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[mf][h] = salpha[wm * WARP_ROWS + mf * 16 + lane / 4 + h * 8];
      rescale |= alpha[mf][h] != 1.f;
    }
  }
  if (__any_sync(0xffffffffu, rescale)) rescale_o(o, alpha);
  kd_u32 pa[MF][4];
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) kd_ldmatrix_x4(pa[mf], p_lane + mf * 16 * P_CHUNKS * 16);
  kd_u32 vb[2][4];
  if constexpr (KV_FP8) {
    kd_ldmatrix_x2_trans_lo(vb[0], tv_addr + (lane & 15) * KV_K_ROW_CHUNKS * 16 + kv_chunk<KV_K_ROW_CHUNKS>(lane, 0) * 16);
  } else {
    kd_ldmatrix_x4_trans(vb[0], tv_addr + v_lane.at(0, 0));
  }
#pragma unroll
  for (int jp = 0; jp < PV_PAIRS; ++jp) {
    if constexpr (KV_FP8) {
      // e4m3 caches: the raw bytes of block jp + 1 (tokens 0-7 and 8-15) are loaded
      // ahead; block jp's are dequantised into the even and odd dims' fragments
      // (kv_fp8.cuh) just before its mma.
      if (jp + 1 < PV_PAIRS) {
        kd_ldmatrix_x2_trans_lo(vb[(jp + 1) & 1], tv_addr + (lane & 15) * KV_K_ROW_CHUNKS * 16 +
                                                      kv_chunk<KV_K_ROW_CHUNKS>(lane, jp + 1) * 16);
      }
      const kd_u32 r0 = vb[jp & 1][0], r1 = vb[jp & 1][1];
      vb[jp & 1][0] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_02>(r0);
      vb[jp & 1][1] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_02>(r1);
      vb[jp & 1][2] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_13>(r0);
      vb[jp & 1][3] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_13>(r1);
    } else {
      if (jp + 1 < PV_PAIRS) kd_ldmatrix_x4_trans(vb[(jp + 1) & 1], tv_addr + v_lane.at((jp + 1) / 4, (jp + 1) % 4));
    }
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
      kd_mma16816<IS_BF16>(o[mf][2 * jp], pa[mf], vb[jp & 1][0], vb[jp & 1][1]);
      kd_mma16816<IS_BF16>(o[mf][2 * jp + 1], pa[mf], vb[jp & 1][2], vb[jp & 1][3]);
    }
  }
}

// Per-thread constants of the tile loop: this lane's shared-memory addresses and
// the row it reduces (its CTA row, first column and tree node, -1 past the rows).
struct TileLanes {
  int wm, lane;
  kd_u32 sk_addr;                 // the K stages
  kd_u32 k_lane;                  // B of S: the token row's byte offset,
  int k_chunk0, k_xor;            // its first chunk and swizzle
  float* part_mine;               // this warp's partial S tile
  const float* part_row;          // the reduced row's chunk in warp 0's partial tile
  kd_u16* sp;                     // P
  float* salpha;                  // per-row O rescale of the tile
  int red_row, red_col0, red_node;
  kd_u32 p_lane;                  // A of O
  LaneRow<QK_CHUNKS> v_lane;      // B of O
  kd_u32 v_col_bytes;             // this warp's first V column (a multiple of 128: swizzle groups kept)

  __device__ __forceinline__ TileLanes(int wm_, int wn, int lane_, kd_u32 sk, float* spart, kd_u16* sp_, float* salpha_,
                                       int row0, int rows_total, const Request& req, int group)
      : wm(wm_), lane(lane_), sk_addr(sk), sp(sp_), salpha(salpha_),
        v_lane((lane_ & 7) + ((lane_ >> 3) & 1) * 8, lane_ >> 4) {
    const int red_row_w = wn * RED_ROWS + lane / RED_LANES;  // within the warp row
    red_row = wm * WARP_ROWS + red_row_w;
    red_col0 = (lane % RED_LANES) * RED_COLS;
    red_node = row0 + red_row < rows_total ? req.node_base + (row0 + red_row) / group : -1;
    const int k_row = (lane & 7) + ((lane >> 4) << 3);
    k_lane = k_row * QK_CHUNKS * 16;
    k_chunk0 = wn * DIM_CHUNKS_W + ((lane >> 3) & 1);
    k_xor = k_row & 7;
    part_mine = spart + (wm * WARPS_N + wn) * PART_WARP_FLOATS;
    part_row = spart + wm * WARPS_N * PART_WARP_FLOATS + red_row_w * BLOCK_N + part_chunk(red_row_w, red_col0 / 4) * 4;
    const int p_row = wm * WARP_ROWS + (lane & 15);
    p_lane = kd_smem_addr(sp) + p_row * P_CHUNKS * 16 + p_chunk(p_row, lane >> 4) * 16;
    v_col_bytes = (wn * V_COLS * KV_ELEM_BYTES / 16) * 16;
  }
};

// The KV tile loop of warp row ROLE (= wm): the rows run the phases in different
// orders (SKEW), each instantiation as straight-line code.
template <int ROLE>
static __device__ __forceinline__ void tile_loop(const kdtree_verify_params& p, const Request& req, const TileLanes& L,
                                                 const KvSource& kv_src, int t_begin, int t_end, int n_tiles,
                                                 const kd_u32 (&qa)[QK_STEPS_W][MF][4], float (&o)[MF][O_TILES][4],
                                                 RowStats& st, bool& bad_page) {
  constexpr kd_u32 K_TILE_BYTES = KV_K_TILE_BYTES;
  if (ROLE == 1) {  // row 1's copies of tile 0 are in
    kd_cp_async_wait<PREFETCH - 1>();
    kv_arrive(BAR_TO_EARLY);
  }
  for (int it = 0; it < n_tiles; ++it) {
    // Tile it is in shared memory (both rows' copies), and stage (it + PREFETCH) %
    // STAGES, read by both rows in tile it - 2 (row 1's PV of it - 2 ran before its
    // QK of it - 1, which preceded its arrival), may be overwritten.
    if (ROLE == 0) {
      kd_cp_async_wait<PREFETCH - 1>();
      kv_wait(BAR_TO_EARLY);
      kv_arrive(BAR_TO_LATE);
    } else {
      kv_wait(BAR_TO_LATE);
    }
    // Tile it + PREFETCH's copies (one commit group per thread and tile): row 1
    // issues its share here, row 0 after its QK, while row 1's mma run.
    auto issue_copies = [&] {
      const int next = it + PREFETCH;
      if (next < n_tiles) {
        load_kv_tile(p, kv_src, t_begin + next * BLOCK_N, t_end, L.sk_addr + (next % STAGES) * K_TILE_BYTES, 0,
                     bad_page);
      }
      kd_cp_async_commit();
    };
    if (ROLE == 1) issue_copies();
    const kd_u32 tk_addr = L.sk_addr + (it % STAGES) * K_TILE_BYTES;
    const int t0 = t_begin + it * BLOCK_N;
    // The late warp row's PV of the previous tile (see SKEW above).
    if (ROLE == 1 && it > 0) {
      compute_pv(o, L.salpha, L.p_lane, L.sk_addr + ((it - 1) % STAGES) * K_TILE_BYTES + L.v_col_bytes, L.v_lane, L.wm, L.lane);
    }

    // ---- compute_qk_partial: all BLOCK_N columns over this warp's dims; the K
    // fragment of step ks + 1 is loaded before step ks's mma.
    {
      float s[MF][S_TILES][4];
      zero_frags(s);
      if constexpr (KV_FP8) {
        // e4m3 caches: step ks's chunk of the 16 token rows, loaded and dequantised
        // right before its mma (kv_fp8.cuh): no fragments held ahead, as the
        // 16-bit loop does, since this kernel has no registers to spare for them.
        const kd_u32 krow = tk_addr + (L.lane & 15) * KV_K_ROW_CHUNKS * 16;
        const int k_group0 = L.k_chunk0 >> 1;  // this warp's first 16-dim group
#pragma unroll
        for (int ks = 0; ks < QK_STEPS_W; ++ks) {
          kd_u32 kraw[2];
          kd_ldmatrix_x2(kraw, krow + kv_chunk<KV_K_ROW_CHUNKS>(L.lane, k_group0 + ks) * 16);
#pragma unroll
          for (int j = 0; j < S_TILES; ++j) {
            const kd_u32 b0 = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_01>(kraw[j]);
            const kd_u32 b1 = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_23>(kraw[j]);
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) kd_mma16816<IS_BF16>(s[mf][j], qa[ks][mf], b0, b1);
          }
        }
      } else {
        kd_u32 kb[2][S_TILES / 2][4];
        auto load_k = [&](kd_u32(&f)[S_TILES / 2][4], int ks) {
          const kd_u32 a = tk_addr + L.k_lane + ((L.k_chunk0 + 2 * ks) ^ L.k_xor) * 16;
#pragma unroll
          for (int jp = 0; jp < S_TILES / 2; ++jp) kd_ldmatrix_x4(f[jp], a + jp * 16 * QK_CHUNKS * 16);
        };
        load_k(kb[0], 0);
#pragma unroll
        for (int ks = 0; ks < QK_STEPS_W; ++ks) {
          if (ks + 1 < QK_STEPS_W) load_k(kb[(ks + 1) & 1], ks + 1);
#pragma unroll
          for (int jp = 0; jp < S_TILES / 2; ++jp) {
#pragma unroll
            for (int mf = 0; mf < MF; ++mf) {
              kd_mma16816<IS_BF16>(s[mf][2 * jp], qa[ks][mf], kb[ks & 1][jp][0], kb[ks & 1][jp][1]);
              kd_mma16816<IS_BF16>(s[mf][2 * jp + 1], qa[ks][mf], kb[ks & 1][jp][2], kb[ks & 1][jp][3]);
            }
          }
        }
      }
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = mf * 16 + L.lane / 4 + h * 8;
#pragma unroll
          for (int j = 0; j < S_TILES; ++j) {
            const int col = j * 8 + (L.lane & 3) * 2;
            *(float2*)(L.part_mine + r * BLOCK_N + part_chunk(r, col / 4) * 4 + col % 4) =
                make_float2(s[mf][j][2 * h], s[mf][j][2 * h + 1]);
          }
        }
      }
    }
    if (ROLE == 0) issue_copies();
    if (ROLE == 1 && it + 1 < n_tiles) {  // row 1's copies of tile it + 1 are in
      kd_cp_async_wait<PREFETCH - 1>();
      kv_arrive(BAR_TO_EARLY);
    }
    warp_row_barrier(L.wm);

    // ---- reduce_rows: the L.lane's RED_COLS scores of its row, masked (prefix
    // visible; tree tokens by the mask bits; past t_end hidden), then the online
    // softmax of the row (exp2 domain, scale folded into the exponent's FFMA).
    {
      float v[RED_COLS];
      {
        float4 acc = *(const float4*)L.part_row;
#pragma unroll
        for (int w = 1; w < WARPS_N; ++w) {
          const float4 x = *(const float4*)(L.part_row + w * PART_WARP_FLOATS);
          acc.x += x.x;
          acc.y += x.y;
          acc.z += x.z;
          acc.w += x.w;
        }
        v[0] = acc.x;
        v[1] = acc.y;
        v[2] = acc.z;
        v[3] = acc.w;
      }
      if (is_edge_tile(t0, req, t_end)) {
        kd_u64 words[MASK_WORDS];
#pragma unroll
        for (int w = 0; w < MASK_WORDS; ++w)
          words[w] = L.red_node >= 0 ? __ldg(p.tree_mask + (long long)L.red_node * MASK_WORDS + w) : 0ull;
#pragma unroll
        for (int c = 0; c < RED_COLS; ++c) v[c] = token_visible(t0 + L.red_col0 + c, t_end, req, words) ? v[c] : -KD_INF;
      }
      float mx = v[0];
#pragma unroll
      for (int c = 1; c < RED_COLS; ++c) mx = fmaxf(mx, v[c]);
#pragma unroll
      for (int d = 1; d < RED_LANES; d *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
      float alpha;
      const float m_use = lazy_max_update(mx, p.scale_log2, st.m, st.l, alpha);
#pragma unroll
      for (int c = 0; c < RED_COLS; ++c) {
        v[c] = lazy_exp(v[c], p.scale_log2, m_use);
        st.l += v[c];
      }
      *(uint2*)(L.sp + L.red_row * BLOCK_N + p_chunk(L.red_row, L.red_col0 / 8) * 8 + L.red_col0 % 8) =
          make_uint2(kd_pack2<IS_BF16>(v[0], v[1]), kd_pack2<IS_BF16>(v[2], v[3]));
      if (L.lane % RED_LANES == 0) L.salpha[L.red_row] = alpha;
    }
    warp_row_barrier(L.wm);

    if (ROLE == 0) compute_pv(o, L.salpha, L.p_lane, tk_addr + L.v_col_bytes, L.v_lane, L.wm, L.lane);
  }
  // The late warp row's PV of the last tile.
  if (ROLE == 1) compute_pv(o, L.salpha, L.p_lane, L.sk_addr + ((n_tiles - 1) % STAGES) * K_TILE_BYTES + L.v_col_bytes, L.v_lane, L.wm, L.lane);
}

// ---- The e4m3 MMA path (MMA_E4M3; fragment layouts in kv_fp8.cuh). QK and PV
// run on m16n8k32 e4m3 MMAs: Q is quantised per row (load_q_tile_e4m3) and its A
// fragments stay in registers, K and V are the cache's codes in shared memory, P
// is quantised to e4m3. PV steps 32 tokens, so a tile is 32 tokens.
//
// Q's dims: the 512 latent dims are 16 k32 steps, 4 per column warp (its V
// columns' dims); the 64 rope dims are 2 k32 steps of the warp row's 2 m16
// fragments, 4 (step, fragment) pairs: column warp wn takes rope step wn % 2 of
// fragment wn / 2. Every warp issues the same 36 MMAs per tile (4 x 8 latent,
// 4 rope), without a branch: a 576 / 4 split would be 4.5 k32 steps.
//
// The reduction in the mma's layout: a warp's S accumulators hold its 32 rows as
// four quarters of 8 rows (m16 fragment mf, half h: rows 16 mf + 8 h + g), and
// lane (g, t) holds columns 8 j + 2 t + c of row g of each. Column warp wn
// reduces quarter wn of its warp row. Each warp permutes its rows (local row r is
// the warp row's row r ^ 8 wn, through its ldmatrix addresses for Q and P and its
// output rows), so its own quarter is always its local quarter 0 (fragment 0,
// half 0: compile-time registers) and its rope fragment is local fragment 0 too.
// A warp writes its other three quarters for the warps that reduce them (local
// quarter d = 2 f + h goes to warp wn ^ d), 3 x 8 floats a lane, and the reducing
// lane (g, t) reads its row's columns from the three others in the same layout:
// no lane exchange; 64-bit accesses of consecutive lanes, one per n8 tile (an
// accumulator's row-half pair, so no register moves), no bank conflicts.
// The row's four lanes (a quad) then run the online softmax, and each packs its
// eight P values as the A fragment takes them (kd_e4m3x4_pack: k slots 4t .. 4t+3
// of a 16-token half are its own columns 2t, 2t+1 of two n8 tiles), so P's rows
// in shared memory are in k-slot order and PV loads them with plain ldmatrix.
constexpr int QK8_LATENT_W = HEAD_DIM_V / 32 / WARPS_N;   // latent k32 steps of a column warp
constexpr int QK8_ROPE_STEPS = (HEAD_DIM - HEAD_DIM_V) / 32;
constexpr int QUARTERS = MF * 2;                            // 8-row quarters of a warp's rows
constexpr int PART8_FLOATS = 32 * (BLOCK_N / 4);            // one quarter of a warp's S: 8 floats a lane, [j][lane][2]
constexpr int PART8_WARP_FLOATS = (QUARTERS - 1) * PART8_FLOATS;  // the three a warp hands on
static_assert(!MMA_E4M3 || (BLOCK_N == 32 && MF == 2 && WARPS_N == QUARTERS && QK8_ROPE_STEPS * MF == WARPS_N &&
                            HEAD_DIM_V % (32 * WARPS_N) == 0 && HEAD_DIM_V + QK8_ROPE_STEPS * 32 == HEAD_DIM),
              "e4m3 MMA: 32-token tiles, 32-row warps, one 8-row quarter and one rope (step, fragment) per column warp");
static_assert(KV_ROWS_PACKED == MMA_E4M3 && QK8_LATENT_W == 4,
              "e4m3 MMA: packed K rows (a fourth stage fits 99 KB); a warp's latent dims are one 8-chunk group");

// Per-thread constants of the e4m3 tile loop (TileLanes of the 16-bit path).
struct TileLanes8 {
  int wm, wn, lane;
  kd_u32 sk_addr;     // the K stages
  kd_u32 k_latent;    // B of S: this lane's token row and the warp's first latent chunk group (bytes)
  kd_u32 k_xo[4];     //   the swizzled byte offsets of chunks 2 i + h of a group
  kd_u32 k_rope;      //   the warp's rope chunk (bytes from the tile)
  float* part_mine;   // this warp's three handed-on quarters
  const float* part_in[QUARTERS - 1];  // the quarters handed to this warp, from warp wn ^ d
  kd_u32 p_lane[MF];  // A of O, per local fragment (the row permutation moves whole fragments)
  kd_u32 p_store;     // this lane's word of its reduced row of P (chunk 0; chunk 1 is +-16 bytes)
  int p_store_step;   // +16 or -16: chunk 1's offset from chunk 0 (P's swizzle)
  float* salpha;
  int red_row, red_node;  // the reduced row (CTA row) and its tree node (-1 past the rows)
  kd_u64 words[MASK_WORDS];  // the reduced row's mask words: read once a segment, not on every edge tile
  float score_log2;       // the reduced row's score scale: scale_log2 x Q's row scale
  kd_u32 v_lane;          // B of O: this lane's token row at the warp's first V chunk
  kd_u32 v_xor;           //   XOR of its chunks' swizzle (bytes)

  // The warp row's row of local row r of this warp.
  __device__ __forceinline__ int row_of(int r) const { return wm * WARP_ROWS + (r ^ (8 * wn)); }

  __device__ __forceinline__ TileLanes8(int wm_, int wn_, int lane_, kd_u32 sk, float* spart, unsigned char* sp,
                                        float* salpha_, int row0, int rows_total, const Request& req, int group,
                                        float q_row_scale, float scale_log2, const kd_u64* mask)
      : wm(wm_), wn(wn_), lane(lane_), sk_addr(sk), salpha(salpha_) {
    const int g = lane / 4, t = lane % 4;
    red_row = wm * WARP_ROWS + 8 * wn + g;
    red_node = row0 + red_row < rows_total ? req.node_base + (row0 + red_row) / group : -1;
#pragma unroll
    for (int w = 0; w < MASK_WORDS; ++w)
      words[w] = red_node >= 0 ? __ldg(mask + (long long)red_node * MASK_WORDS + w) : 0ull;
    // A zero Q row has scale 0 and codes 0: its scores are 0 with any scale, and 1
    // keeps a masked score's -inf from becoming NaN.
    score_log2 = scale_log2 * (q_row_scale > 0.f ? q_row_scale : 1.f);
    const int k_row = (lane & 7) + ((lane >> 4) << 3), h = (lane >> 3) & 1;
    k_latent = k_row * KV_K_ROW_CHUNKS * 16 + wn * QK8_LATENT_W / 4 * 128;
#pragma unroll
    for (int i = 0; i < 4; ++i) k_xo[i] = kv_chunk<KV_K_ROW_CHUNKS>(k_row, 2 * i + h) * 16;
    const int rope_chunk = HEAD_DIM_V / 16 + 2 * (wn % QK8_ROPE_STEPS) + h;
    k_rope = k_row * KV_K_ROW_CHUNKS * 16 + kv_chunk<KV_K_ROW_CHUNKS>(k_row, rope_chunk) * 16;
    part_mine = spart + (wm * WARPS_N + wn) * PART8_WARP_FLOATS;
#pragma unroll
    for (int d = 1; d < QUARTERS; ++d)
      part_in[d - 1] = spart + (wm * WARPS_N + (wn ^ d)) * PART8_WARP_FLOATS + (d - 1) * PART8_FLOATS;
    const kd_u32 sp_addr = kd_smem_addr(sp);
#pragma unroll
    for (int f = 0; f < MF; ++f) {
      const int pr = row_of(f * 16 + (lane & 15));
      p_lane[f] = sp_addr + pr * (BLOCK_N / 16) * 16 + p_chunk(pr, lane >> 4) * 16;
    }
    p_store = sp_addr + red_row * (BLOCK_N / 16) * 16 + p_chunk(red_row, 0) * 16 + 4 * t;
    p_store_step = p_chunk(red_row, 0) == 0 ? 16 : -16;
    v_lane = lane * KV_K_ROW_CHUNKS * 16 + wn * V_COLS / 16 * 16;  // V_COLS bytes: whole swizzle groups
    v_xor = kv_chunk<KV_K_ROW_CHUNKS>(lane, 0) * 16;  // the swizzle XORs a chunk's bits within its group
  }
};

// ---- compute_pv8: rescale O where a row's reference max moved, then O += P V
// over this warp's V columns, one 16-dim block (two n8 tiles: even and odd dims)
// per step, 32 tokens deep. tv_addr: the tile's first K row (MLA: V is its first
// HEAD_DIM_V bytes).
static __device__ __forceinline__ void compute_pv8(float (&o)[MF][O_TILES][4], const TileLanes8& L, kd_u32 tv_addr) {
  float alpha[MF][2];
  bool rescale = false;
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[f][h] = L.salpha[L.row_of(f * 16 + h * 8 + L.lane / 4)];
      rescale |= alpha[f][h] != 1.f;
    }
  }
  if (__any_sync(0xffffffffu, rescale)) rescale_o(o, alpha);
  kd_u32 pa[MF][4];
#pragma unroll
  for (int f = 0; f < MF; ++f) kd_ldmatrix_x4(pa[f], L.p_lane[f]);
  const kd_u32 tv = tv_addr + L.v_lane;
  kd_u32 vr[2][4];
  kd_ldmatrix_x4_trans(vr[0], tv + L.v_xor);
#pragma unroll
  for (int jp = 0; jp < PV_PAIRS; ++jp) {
    // Block jp + 1's tokens are loaded ahead; block jp's bytes become the even and
    // odd dims' B fragments just before its mma (kv_fp8.cuh).
    if (jp + 1 < PV_PAIRS) kd_ldmatrix_x4_trans(vr[(jp + 1) & 1], tv + (((jp + 1) * 16) ^ L.v_xor));
    const kd_u32(&r)[4] = vr[jp & 1];
    const kd_u32 b0 = __byte_perm(r[0], r[1], E4M3_EVEN_OF_PAIR), b1 = __byte_perm(r[2], r[3], E4M3_EVEN_OF_PAIR);
    const kd_u32 b2 = __byte_perm(r[0], r[1], E4M3_ODD_OF_PAIR), b3 = __byte_perm(r[2], r[3], E4M3_ODD_OF_PAIR);
#pragma unroll
    for (int f = 0; f < MF; ++f) {
      kd_mma_e4m3<MMA_BLOCK_SCALED>(o[f][2 * jp], pa[f], b0, b1);
      kd_mma_e4m3<MMA_BLOCK_SCALED>(o[f][2 * jp + 1], pa[f], b2, b3);
    }
  }
}

// The visibility of 32 consecutive tokens from t_first for one row whose mask words
// are `words` (bit i: token t_first + i): prefix tokens visible, tree tokens by their
// mask bits, tokens at or past t_end hidden. Branch-free: a funnel shift of the mask
// words' 32-bit halves, so an edge tile costs a few instructions, not a branch per column.
static __device__ __forceinline__ kd_u32 visible_bits32(int t_first, int t_end, const Request& req,
                                                        const kd_u64 (&words)[MASK_WORDS]) {
  const int tree0 = t_first - req.prefix;  // tree index of bit 0 (< W; negative in the prefix)
  const int i = max(tree0, 0) >> 5;        // the 32-bit half holding tree0's bit
  kd_u32 lo = 0u, hi = 0u;
#pragma unroll
  for (int k = 0; k < 2 * MASK_WORDS; ++k) {
    const kd_u32 half = (kd_u32)(words[k / 2] >> (32 * (k % 2)));
    lo = k == i ? half : lo;
    hi = k == i + 1 ? half : hi;
  }
  const kd_u32 tree_bits = __funnelshift_r(lo, hi, tree0 & 31);
  // In the prefix: the first -tree0 tokens visible, then the tree's first bits.
  const int n = min(-tree0, 32);
  const kd_u32 low = n >= 32 ? ~0u : (1u << n) - 1u;
  const kd_u32 prefix_bits = low | (n >= 32 ? 0u : (lo << n));
  kd_u32 bits = tree0 >= 0 ? tree_bits : prefix_bits;
  const int lim = t_end - t_first;  // tokens before t_end
  bits &= lim >= 32 ? ~0u : lim <= 0 ? 0u : (1u << lim) - 1u;
  return bits;
}

// The e4m3 KV tile loop of warp row ROLE (tile_loop's phases and SKEW).
// qa: the warp's latent A fragments per step and local fragment; qr: its rope one
// (local fragment 0).
template <int ROLE>
static __device__ __forceinline__ void tile_loop8(const kdtree_verify_params& p, const Request& req, const TileLanes8& L,
                                                  const KvSource& kv_src, int t_begin, int t_end, int n_tiles,
                                                  const kd_u32 (&qa)[QK8_LATENT_W][MF][4], const kd_u32 (&qr)[4],
                                                  float (&o)[MF][O_TILES][4], RowStats& st, bool& bad_page) {
  constexpr kd_u32 K_TILE_BYTES = KV_K_TILE_BYTES;
  if (ROLE == 1) {
    kd_cp_async_wait<PREFETCH - 1>();
    kv_arrive(BAR_TO_EARLY);
  }
  for (int it = 0; it < n_tiles; ++it) {
    if (ROLE == 0) {
      kd_cp_async_wait<PREFETCH - 1>();
      kv_wait(BAR_TO_EARLY);
      kv_arrive(BAR_TO_LATE);
    } else {
      kv_wait(BAR_TO_LATE);
    }
    auto issue_copies = [&] {
      const int next = it + PREFETCH;
      if (next < n_tiles) {
        load_kv_tile(p, kv_src, t_begin + next * BLOCK_N, t_end, L.sk_addr + (next % STAGES) * K_TILE_BYTES, 0,
                     bad_page);
      }
      kd_cp_async_commit();
    };
    if (ROLE == 1) issue_copies();
    const kd_u32 tk_addr = L.sk_addr + (it % STAGES) * K_TILE_BYTES;
    const int t0 = t_begin + it * BLOCK_N;
    if (ROLE == 1 && it > 0) compute_pv8(o, L, L.sk_addr + ((it - 1) % STAGES) * K_TILE_BYTES);

    // ---- QK: the latent steps over both fragments, then the rope step over local
    // fragment 0; step ks + 1's K fragments (32 tokens: two x4 loads) are loaded
    // before step ks's mma.
    float s[MF][S_TILES][4];
    zero_frags(s);
    {
      constexpr int STEPS = QK8_LATENT_W + 1;
      kd_u32 kb[2][S_TILES / 2][4];
      auto load_k = [&](kd_u32(&f)[S_TILES / 2][4], int ks) {
        const kd_u32 a = tk_addr + (ks < QK8_LATENT_W ? L.k_latent + ks / 4 * 128 + L.k_xo[ks % 4] : L.k_rope);
#pragma unroll
        for (int jp = 0; jp < S_TILES / 2; ++jp) kd_ldmatrix_x4(f[jp], a + jp * 16 * KV_K_ROW_CHUNKS * 16);
      };
      load_k(kb[0], 0);
#pragma unroll
      for (int ks = 0; ks < STEPS; ++ks) {
        if (ks + 1 < STEPS) load_k(kb[(ks + 1) & 1], ks + 1);
#pragma unroll
        for (int jp = 0; jp < S_TILES / 2; ++jp) {
#pragma unroll
          for (int f = 0; f < (ks < QK8_LATENT_W ? MF : 1); ++f) {
            const kd_u32(&a)[4] = ks < QK8_LATENT_W ? qa[ks][f] : qr;
            kd_mma_e4m3<MMA_BLOCK_SCALED>(s[f][2 * jp], a, kb[ks & 1][jp][0], kb[ks & 1][jp][1]);
            kd_mma_e4m3<MMA_BLOCK_SCALED>(s[f][2 * jp + 1], a, kb[ks & 1][jp][2], kb[ks & 1][jp][3]);
          }
        }
      }
    }
    // ---- the three quarters this warp hands on: local quarter d to warp wn ^ d,
    // 8 floats a lane as two float4 (n8 tiles 0, 1 then 2, 3).
#pragma unroll
    for (int d = 1; d < QUARTERS; ++d) {
      const int f = d / 2, h = d % 2;
      float* dst = L.part_mine + (d - 1) * PART8_FLOATS + L.lane * 2;
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) *(float2*)(dst + j * 32 * 2) = make_float2(s[f][j][2 * h], s[f][j][2 * h + 1]);
    }
    if (ROLE == 0) issue_copies();
    if (ROLE == 1 && it + 1 < n_tiles) {
      kd_cp_async_wait<PREFETCH - 1>();
      kv_arrive(BAR_TO_EARLY);
    }
    warp_row_barrier(L.wm);

    // ---- reduce: the lane's 8 scores of its row (own quarter + the three handed
    // to it), masked, then the row's online softmax over its quad.
    {
      float v[2 * S_TILES];  // v[2 j + c]: column 8 j + 2 t + c
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) {
        v[2 * j] = s[0][j][0];
        v[2 * j + 1] = s[0][j][1];
      }
#pragma unroll
      for (int d = 1; d < QUARTERS; ++d) {
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
          const float2 x = *(const float2*)(L.part_in[d - 1] + j * 32 * 2 + L.lane * 2);
          v[2 * j] += x.x;
          v[2 * j + 1] += x.y;
        }
      }
      if (is_edge_tile(t0, req, t_end)) {
        // The lane's columns 8 j + 2 t + c are bits 8 j + c from t0 + 2 t.
        const kd_u32 bits = visible_bits32(t0 + (L.lane % 4) * 2, t_end, req, L.words);
#pragma unroll
        for (int c = 0; c < 2 * S_TILES; ++c) v[c] = (bits >> ((c / 2) * 8 + c % 2)) & 1u ? v[c] : -KD_INF;
      }
      // The row max as a tree (3 dependent steps, not 7): it is on the path to P.
      float m4[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) m4[c] = fmaxf(v[c], v[c + 4]);
      float mx = fmaxf(fmaxf(m4[0], m4[2]), fmaxf(m4[1], m4[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float alpha;
      const float m_use = lazy_max_update(mx, L.score_log2, st.m, st.l, alpha);
#pragma unroll
      for (int c = 0; c < 2 * S_TILES; ++c) {
        v[c] = lazy_exp(v[c], L.score_log2, m_use);
        st.l += v[c];
      }
      // k slots 4t .. 4t+3 of each 16-token half: columns 2t, 2t+1 of its two n8 tiles.
      const kd_u32 w0 = kd_e4m3x4_pack(v[0], v[1], v[2], v[3]), w1 = kd_e4m3x4_pack(v[4], v[5], v[6], v[7]);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(L.p_store), "r"(w0));
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(L.p_store + L.p_store_step), "r"(w1));
      if (L.lane % 4 == 0) L.salpha[L.red_row] = alpha;
    }
    warp_row_barrier(L.wm);

    if (ROLE == 0) compute_pv8(o, L, tk_addr);
  }
  if (ROLE == 1) compute_pv8(o, L, L.sk_addr + ((n_tiles - 1) % STAGES) * K_TILE_BYTES);
}

// ---- Splits merged in a cluster (p.cluster_splits > 1; verify_attention_common.cuh):
// cluster_stash leaves each split's rows in its K stages, by write_row as a split
// partial.
constexpr bool CLUSTER_MERGE = KD_CLUSTER_MERGE;
static_assert(!CLUSTER_MERGE || CLUSTER_STASH_BYTES <= SMEM_PART_S, "the K stages hold a split's rows");

template <typename RowOf>
static __device__ __forceinline__ void cluster_stash(const kdtree_verify_params& p, const float (&o)[MF][O_TILES][4],
                                                     bool poisoned, unsigned char* smem_raw, int wn, int lane,
                                                     RowOf row_of) {
  const float* srow_l = (const float*)(smem_raw + SMEM_STATS) + BLOCK_M;  // the segment's layout: alpha, l, m
  const float* srow_m = srow_l + BLOCK_M;
  // write_row's split partials, with the stash in place of the workspace.
  kdtree_verify_params stash = p;
  stash.partial_o = smem_raw;
  stash.partial_lse = (float*)(smem_raw + CLUSTER_LSE);
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_of(f * 16 + lane / 4 + h * 8);
      write_row<O_TILES, KV_FP8, CLUSTER_ROW>(stash, o[f], h, -1, r, srow_l[r], srow_m[r], poisoned,
                                              wn * V_COLS + (lane & 3) * 2, wn == 0 && (lane & 3) == 0);
    }
  }
}

// One segment of the e4m3 MMA path: Q to registers, the tile loop, the rows.
// cluster: the cluster entry's rows (a compile-time constant at each call), stashed
// for the cluster_merge that verify_rows runs after it.
static __device__ __forceinline__ void segment8(const kdtree_verify_params& p, const Request& req, SegmentWalk& walk,
                                                int kv_head, int b, int row0, int rows_total, int t_begin, int t_end,
                                                unsigned char* smem_raw, int wm, int wn, int lane, bool cluster) {
  float* spart = (float*)(smem_raw + SMEM_PART_S);     // [WARPS_M][WARPS_N][QUARTERS - 1][32 lanes][8]
  unsigned char* sp = smem_raw + SMEM_P;               // [BLOCK_M][BLOCK_N] e4m3 codes, k-slot order
  float* salpha = (float*)(smem_raw + SMEM_STATS);     // [BLOCK_M] this tile's O rescale
  float* srow_l = salpha + BLOCK_M;                    // [BLOCK_M] row sums, at the end
  float* srow_m = srow_l + BLOCK_M;                    // [BLOCK_M] reference maxima, at the end
  constexpr kd_u32 K_TILE_BYTES = KV_K_TILE_BYTES;
  const kd_u32 sk_addr = kd_smem_addr(smem_raw);
  const int red_row = wm * WARP_ROWS + 8 * wn + lane / 4;  // TileLanes8::red_row
  auto row_of = [&](int r) { return wm * WARP_ROWS + (r ^ (8 * wn)); };

  // ---- Q to registers: quantised per row into shared memory (where the KV stages
  // go next; rows past the request's rows are zero), then each warp's A fragments
  // in its row order: the latent steps of its dims, and its rope step.
  kd_u32 qa[QK8_LATENT_W][MF][4], qr[4];
  float q_row_scale;
  {
    float* sq_scale = (float*)(smem_raw + SMEM_Q_SCALE);
    load_q_tile_e4m3(p, req, row0, rows_total, kv_head, sk_addr, sq_scale);
    __syncthreads();
#pragma unroll
    for (int f = 0; f < MF; ++f) {
      const int r = row_of(f * 16 + (lane & 15));
#pragma unroll
      for (int i = 0; i < QK8_LATENT_W; ++i) {
        const int chunk = 2 * (wn * QK8_LATENT_W + i) + (lane >> 4);
        kd_ldmatrix_x4(qa[i][f], sk_addr + (r * KV_K_ROW_CHUNKS + kv_chunk<KV_K_ROW_CHUNKS>(r, chunk)) * 16);
      }
    }
    {
      const int r = row_of(lane & 15);
      const int chunk = HEAD_DIM_V / 16 + 2 * (wn % QK8_ROPE_STEPS) + (lane >> 4);
      kd_ldmatrix_x4(qr, sk_addr + (r * KV_K_ROW_CHUNKS + kv_chunk<KV_K_ROW_CHUNKS>(r, chunk)) * 16);
    }
    q_row_scale = sq_scale[red_row];
    __syncthreads();  // every warp has its Q before the KV stages overwrite it
  }

  bool bad_page = false;
  const KvSource kv_src = kv_source(p, b, kv_head);
  const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;
#pragma unroll
  for (int s = 0; s < PREFETCH; ++s) {
    if (s < n_tiles) load_kv_tile(p, kv_src, t_begin + s * BLOCK_N, t_end, sk_addr + s * K_TILE_BYTES, 0, bad_page);
    kd_cp_async_commit();
  }

  float o[MF][O_TILES][4];
  zero_frags(o);
  RowStats st = {-KD_INF, 0.f};  // of the row this lane reduces
  const TileLanes8 lanes(wm, wn, lane, sk_addr, spart, sp, salpha, row0, rows_total, req, p.group, q_row_scale,
                         p.scale_log2, p.tree_mask);
  if (wm == 0) {
    tile_loop8<0>(p, req, lanes, kv_src, t_begin, t_end, n_tiles, qa, qr, o, st, bad_page);
  } else {
    tile_loop8<1>(p, req, lanes, kv_src, t_begin, t_end, n_tiles, qa, qr, o, st, bad_page);
  }
  kd_cp_async_wait<0>();

  // ---- row sums over the row's quad, published with the reference maxima.
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  if (lane % 4 == 0) {
    srow_l[red_row] = st.l;
    srow_m[red_row] = st.m;
  }
  const bool poisoned = bad_page_seen(p, bad_page);

  // ---- writing rows (the 16-bit path's), each local row to its CTA row.
  const Segment target = segment_target(walk);
  const bool partial = target.partial_split >= 0 || target.partial_slot >= 0;
  const int out_head0 = ((volatile Segment&)walk.seg).kv_head * p.group;
  if (cluster) {
    cluster_stash(p, o, poisoned, smem_raw, wn, lane, row_of);
    return;
  }
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_of(f * 16 + lane / 4 + h * 8);
      const int gr = row0 + r;
      if (gr >= rows_total) continue;
      const long long orow = out_row(p, req.node_base, gr, out_head0);
      const long long prow = partial ? partial_row(p, target, r, orow) : -1;
      write_row(p, o[f], h, orow, prow, srow_l[r], srow_m[r], poisoned, wn * V_COLS + (lane & 3) * 2,
                wn == 0 && (lane & 3) == 0);
    }
  }
}

// The kernel body; CLUSTER: the entry whose splits merge in a cluster (the e4m3 MMA
// path only), a separate function so that the usual entry's code is not touched.
template <bool CLUSTER>
static __device__ __forceinline__ void verify_rows(const kdtree_verify_params& p) {
  static_assert(!CLUSTER || (CLUSTER_MERGE && MMA_E4M3), "the cluster entry: the e4m3 MMA path, its rows fitting the K stages");
  kd_launch_dependents();  // the split combine may launch now; it waits for this grid's writes
  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* spart = (float*)(smem_raw + SMEM_PART_S);         // [WARPS_M][WARPS_N][WARP_ROWS][BLOCK_N]
  kd_u16* sp = (kd_u16*)(smem_raw + SMEM_P);            // [BLOCK_M][BLOCK_N]
  float* salpha = (float*)(smem_raw + SMEM_STATS);      // [BLOCK_M] this tile's O rescale
  float* srow_l = salpha + BLOCK_M;                     // [BLOCK_M] row sums, at the end
  float* srow_m = srow_l + BLOCK_M;                     // [BLOCK_M] reference maxima, at the end
  constexpr kd_u32 K_TILE_BYTES = KV_K_TILE_BYTES;
  const kd_u32 sk_addr = kd_smem_addr(smem_raw);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  // The CTA's segments: its grid point (uniform splits), or its range of the
  // stream-K unit line (p.stream_ctas > 0; see verify_attention_common.cuh).
  SegmentWalk& walk = *(SegmentWalk*)(smem_raw + SMEM_WALK);
  walk_begin(p, walk, (long long*)smem_raw);
#pragma unroll 1
  for (bool first = true;; first = false) {
    __syncthreads();  // the last segment's reads of walk.seg are done
    if (threadIdx.x == 0) walk_next(p, walk, first);
    __syncthreads();
    if (walk.done) {
      if (threadIdx.x == 0) walk_end(p, walk);
      break;
    }
    const Segment sg = walk.seg;
    const int kv_head = sg.kv_head;
    const Request req = load_request(p, sg.b);
    if (!req.valid) {
      // Malformed request: one segment per (request, kv head) writes NaN to every
      // row the request claims (within the node arrays), so nothing stale is left.
      if (sg.m_tile == 0 && sg.t_begin == 0) {
        if (p.error_flags && threadIdx.x == 0) atomicOr(p.error_flags, request_errors(p, req));
        poison_request(p, req, kv_head);
      }
      continue;
    }
    const int rows_total = req.n_nodes * p.group;
    const int row0 = sg.m_tile * BLOCK_M;
    if (row0 >= rows_total) continue;
    const int t_begin = sg.t_begin;
    const int t_end = min(req.kv_len, sg.t_end);
    if constexpr (CLUSTER) {
      // One merge after either branch, so the entry inlines it once (inlined in both it
      // took 4 more registers and 12% more cycles a tile). A split past kv_len stashes LSE -inf.
      if (t_begin < t_end) {
        segment8(p, req, walk, kv_head, sg.b, row0, rows_total, t_begin, t_end, smem_raw, wm, wn, lane, true);
      } else {
        cluster_stash_nothing(smem_raw);
      }
      cluster_merge(p, req, row0, rows_total, kv_head * p.group, smem_raw);  // the stash at the K stages
      continue;
    }
    if (t_begin >= t_end) continue;  // the combine kernel skips splits past kv_len
    if constexpr (MMA_E4M3) {
      segment8(p, req, walk, kv_head, sg.b, row0, rows_total, t_begin, t_end, smem_raw, wm, wn, lane, false);
      continue;
    }

    // ---- Q to registers: the tile is staged through shared memory (where the KV
    // stages go next), rows past the request's rows zero-filled.
    kd_u32 qa[QK_STEPS_W][MF][4];
    {
      if constexpr (KV_FP8) {
        load_q_tile_kv_fp8(p, req, row0, rows_total, kv_head, sk_addr);
      } else {
        load_q_tile(p, req, row0, rows_total, kv_head, sk_addr);
      }
      kd_cp_async_commit();
      kd_cp_async_wait<0>();
      __syncthreads();
      const int r = wm * WARP_ROWS + (lane & 15);
#pragma unroll
      for (int ks = 0; ks < QK_STEPS_W; ++ks) {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          const int chunk = wn * DIM_CHUNKS_W + 2 * ks + (lane >> 4);
          kd_ldmatrix_x4(qa[ks][mf], sk_addr + swizzle<QK_CHUNKS>(r + mf * 16, chunk) * 16);
        }
      }
      __syncthreads();  // every warp has its Q before the KV stages overwrite it
    }

    bool bad_page = false;
    const KvSource kv_src = kv_source(p, sg.b, kv_head);
    const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;
#pragma unroll
    for (int s = 0; s < PREFETCH; ++s) {
      if (s < n_tiles) load_kv_tile(p, kv_src, t_begin + s * BLOCK_N, t_end, sk_addr + s * K_TILE_BYTES, 0, bad_page);
      kd_cp_async_commit();
    }

    float o[MF][O_TILES][4];
    zero_frags(o);

    RowStats st = {-KD_INF, 0.f};  // of the row this lane reduces
    const TileLanes lanes(wm, wn, lane, sk_addr, spart, sp, salpha, row0, rows_total, req, p.group);
    if (wm == 0) {
      tile_loop<0>(p, req, lanes, kv_src, t_begin, t_end, n_tiles, qa, o, st, bad_page);
    } else {
      tile_loop<1>(p, req, lanes, kv_src, t_begin, t_end, n_tiles, qa, o, st, bad_page);
    }
    kd_cp_async_wait<0>();

    // ---- row sums over the row's lanes, published with the reference maxima.
#pragma unroll
    for (int d = 1; d < RED_LANES; d *= 2) st.l += __shfl_xor_sync(0xffffffffu, st.l, d);
    if (lane % RED_LANES == 0) {
      srow_l[lanes.red_row] = st.l;
      srow_m[lanes.red_row] = st.m;
    }
    // A bad page or request poisons its rows with NaN (the flag says why).
    const bool poisoned = bad_page_seen(p, bad_page);

    // ---- writing rows: as verify_attention.cu (16-bit out and natural-log LSE, or
    // the 16-bit partials and log2-domain LSE of a split or a stream-K slot).
    // The segment's target, read again: it holds no registers through the loop.
    const Segment target = segment_target(walk);
    const bool partial = target.partial_split >= 0 || target.partial_slot >= 0;
    const int out_head0 = ((volatile Segment&)walk.seg).kv_head * p.group;  // the KV head's first query head
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * WARP_ROWS + mf * 16 + lane / 4 + h * 8;
        const int gr = row0 + r;
        if (gr >= rows_total) continue;
        const long long orow = out_row(p, req.node_base, gr, out_head0);
        const long long prow = partial ? partial_row(p, target, r, orow) : -1;
        write_row(p, o[mf], h, orow, prow, srow_l[r], srow_m[r], poisoned, wn * V_COLS + (lane & 3) * 2,
                  wn == 0 && (lane & 3) == 0);
      }
    }
  }  // segments
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) kdtree_verify_attention(const kdtree_verify_params p) {
  verify_rows<false>(p);
}

#if KD_CLUSTER_MERGE
// Uniform splits merged in a thread-block cluster: launched (sm_90+) as clusters of
// p.cluster_splits CTAs along z, with cluster_splits > 1.
extern "C" __global__ void __launch_bounds__(THREADS, 1) kdtree_verify_attention_cluster(const kdtree_verify_params p) {
  verify_rows<true>(p);
}
#endif
