// verify_attention: tree attention over a paged KV cache, flash style on tensor
// cores (mma.sync m16n8k16 + ldmatrix + cp.async: sm_80 and newer, sm_120 too).
//
// One CTA owns BLOCK_M rows of one (request, kv head): row r is tree node r / GROUP,
// query head r % GROUP, so every node and every head sharing the KV head reads
// each KV tile once. KV tiles of BLOCK_N tokens stream through a STAGES-deep
// cp.async pipeline. Warps form WARPS_M x WARPS_N: a warp row owns WARP_ROWS rows
// (16 or 32: MF m16 fragments; 32 halves the B-operand ldmatrix traffic per mma);
// the WARPS_N warps of a row split the tile's columns for S = Q K^T and the V
// columns for O += P V, exchanging the row max and P through shared memory (with
// one column warp, P stays in registers). Split-KV: blockIdx.z takes split_tokens
// tokens and writes 16-bit partials that kdtree_verify_combine merges by LSE.

#include "verify_attention_config.h"
#include "verify_attention_common.cuh"
#include "verify_attention_combine.cuh"

// Byte offsets of the K stages, V stages, P and the row exchange in dynamic shared memory (Q at 0).
constexpr int SMEM_K = KD_SMEM_K;
constexpr int SMEM_V = KD_SMEM_V;
constexpr int SMEM_P = KD_SMEM_P;
constexpr int SMEM_RED = KD_SMEM_RED;
constexpr int SMEM_Q_SCALE = KD_SMEM_Q_SCALE;

constexpr int P_CHUNKS = BLOCK_N / 8;
constexpr int S_TILES = BLOCK_N / WARPS_N / 8;      // n8 tiles of S per warp
constexpr int O_TILES = HEAD_DIM_V / WARPS_N / 8;   // n8 tiles of O per warp
constexpr int V_COLS = HEAD_DIM_V / WARPS_N;
static_assert(S_TILES >= 1 && O_TILES % 2 == 0, "tile split");
static_assert(WARPS_N == 1 || V_COLS % 64 == 0, "a column warp's V slice keeps whole swizzle groups");
static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM_V % 16 == 0, "the QK loop steps 64 dims; PV 16");

// Shared memory (dynamic, offsets SMEM_*): Q | K stages | V stages (GQA) | P (WARPS_N > 1) | row exchange.

// ---- S = Q K^T, one k16 step (16 of HEAD_DIM) at a time: the A fragments of the
// warp's MF row fragments and the B fragments of its S_TILES column tiles.
constexpr int QK_STEPS = HEAD_DIM / 16;
constexpr int S_PAIRS = S_TILES / 2;
struct QkFrags {
  kd_u32 a[MF][4];
  kd_u32 b[S_PAIRS > 0 ? S_PAIRS : 1][4];
  kd_u32 b_odd[2];  // the last column tile when S_TILES is odd
};

// QC, KC: the Q and K rows' strides in 16-byte chunks. A step is 32 bytes of the
// rows: k16 of 16-bit values, or k32 of e4m3 codes on the e4m3 MMA path, whose
// fragments load the same way (kv_fp8.cuh).
template <int QC, int KC>
static __device__ __forceinline__ void load_qk_frags(QkFrags& f, int k, kd_u32 sq_addr, kd_u32 tk_addr,
                                                     const LaneRow<QC>& q_lane, const LaneRow<KC>& k_lane) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) kd_ldmatrix_x4(f.a[mf], sq_addr + q_lane.at(k / 4, k % 4) + mf * 16 * QC * 16);
  const kd_u32 kb = tk_addr + k_lane.at(k / 4, k % 4);
#pragma unroll
  for (int jp = 0; jp < S_PAIRS; ++jp) kd_ldmatrix_x4(f.b[jp], kb + jp * 16 * KC * 16);
  // Lanes 0-15 give the addresses of an x2 load: rows (S_TILES - 1) * 8 + lane % 8.
  if (S_TILES % 2) kd_ldmatrix_x2(f.b_odd, kb + (S_TILES - 1) * 8 * KC * 16);
}

// The tensor-core step of both products: m16n8k16 on q's 16-bit type, or m16n8k32
// on e4m3 codes (E4M3).
template <bool E4M3>
static __device__ __forceinline__ void mma_step(float (&d)[4], const kd_u32 (&a)[4], kd_u32 b0, kd_u32 b1) {
  if constexpr (E4M3) {
    kd_mma_e4m3<MMA_BLOCK_SCALED>(d, a, b0, b1);
  } else {
    kd_mma16816<IS_BF16>(d, a, b0, b1);
  }
}

template <bool E4M3>
static __device__ __forceinline__ void qk_mma(float (&s)[MF][S_TILES][4], const QkFrags& f) {
#pragma unroll
  for (int jp = 0; jp < S_PAIRS; ++jp) {
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
      mma_step<E4M3>(s[mf][2 * jp], f.a[mf], f.b[jp][0], f.b[jp][1]);
      mma_step<E4M3>(s[mf][2 * jp + 1], f.a[mf], f.b[jp][2], f.b[jp][3]);
    }
  }
  if (S_TILES % 2) {
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) mma_step<E4M3>(s[mf][S_TILES - 1], f.a[mf], f.b_odd[0], f.b_odd[1]);
  }
}

// e4m3 caches (kv_fp8.cuh): step k's B fragments from one 16-byte chunk of each
// token row, dequantised. kf_row: this lane's row (s_col0 + lane % 16) in bytes;
// kf_odd: the odd last tile's row (s_col0 + (S_TILES - 1) * 8 + lane % 8).
static __device__ __forceinline__ void load_qk_frags_kv_fp8(QkFrags& f, int k, kd_u32 sq_addr, kd_u32 tk_addr,
                                                            const LaneRow<QK_CHUNKS>& q_lane, kd_u32 kf_row,
                                                            kd_u32 kf_odd, int lane) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) kd_ldmatrix_x4(f.a[mf], sq_addr + q_lane.at(k / 4, k % 4) + mf * 16 * QK_CHUNKS * 16);
  const kd_u32 chunk = kv_chunk<KV_K_ROW_CHUNKS>(lane, k) * 16;
#pragma unroll
  for (int jp = 0; jp < S_PAIRS; ++jp) {
    kd_u32 r[2];
    kd_ldmatrix_x2(r, tk_addr + kf_row + jp * 16 * KV_K_ROW_CHUNKS * 16 + chunk);
    f.b[jp][0] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_01>(r[0]);
    f.b[jp][1] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_23>(r[0]);
    f.b[jp][2] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_01>(r[1]);
    f.b[jp][3] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_23>(r[1]);
  }
  if (S_TILES % 2) {
    kd_u32 r;
    kd_ldmatrix_x1(r, tk_addr + kf_odd + chunk);
    f.b_odd[0] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_01>(r);
    f.b_odd[1] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_23>(r);
  }
}

// ---- O(WARP_ROWS x V_COLS) += P(WARP_ROWS x BLOCK_N) V(BLOCK_N x V_COLS), in steps
// of one k16 slice (kk) x two n8 column tiles (jp); tv is the byte address of the
// tile's first V row at this warp's first column. A V fragment serves all MF row
// fragments, and the next step's V fragment is loaded before this step's mma.
constexpr int PV_PAIRS = O_TILES / 2;
constexpr int PV_STEPS = BLOCK_N / 16 * PV_PAIRS;
template <int ROW_CHUNKS>
static __device__ __forceinline__ void load_v_frag(kd_u32 (&b)[4], int step, kd_u32 tv, const LaneRow<ROW_CHUNKS>& v_lane) {
  const int kk = step / PV_PAIRS, j = 2 * (step % PV_PAIRS);
  kd_ldmatrix_x4_trans(b, tv + kk * 16 * ROW_CHUNKS * 16 + v_lane.at(j / 8, (j / 2) % 4));
}

// e4m3 caches (kv_fp8.cuh): step's V fragments, the even and odd dims of 16-dim
// block jp (n8 tiles 2jp and 2jp + 1) for the 16 tokens of slice kk. vf_row:
// this lane's token row (lane % 16) in bytes; ROW_CHUNKS the rows' stride.
template <int ROW_CHUNKS>
static __device__ __forceinline__ void load_v_frag_kv_fp8(kd_u32 (&b)[4], int step, kd_u32 tv, kd_u32 vf_row,
                                                          int lane) {
  const int kk = step / PV_PAIRS, jp = step % PV_PAIRS;
  kd_u32 r[2];
  kd_ldmatrix_x2_trans(r, tv + kk * 16 * ROW_CHUNKS * 16 + vf_row + kv_chunk<ROW_CHUNKS>(lane, jp) * 16);
  b[0] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_02>(r[0]);
  b[1] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_02>(r[1]);
  b[2] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_13>(r[0]);
  b[3] = kd_e4m3x2_to_16<IS_BF16, E4M3_BYTES_13>(r[1]);
}

// P's A fragments of slice kk: from the S accumulators (one column warp: the C
// layout of two n8 tiles is the A layout of one k16 step) or from shared memory.
template <int P_ROW_CHUNKS>
static __device__ __forceinline__ void load_p_frags(kd_u32 (&a)[MF][4], int kk, const float (&s)[MF][S_TILES][4],
                                                    kd_u32 sp_addr, const LaneRow<P_ROW_CHUNKS>& p_lane) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
    if (WARPS_N == 1) {
      a[mf][0] = kd_pack2<IS_BF16>(s[mf][2 * kk][0], s[mf][2 * kk][1]);
      a[mf][1] = kd_pack2<IS_BF16>(s[mf][2 * kk][2], s[mf][2 * kk][3]);
      a[mf][2] = kd_pack2<IS_BF16>(s[mf][2 * kk + 1][0], s[mf][2 * kk + 1][1]);
      a[mf][3] = kd_pack2<IS_BF16>(s[mf][2 * kk + 1][2], s[mf][2 * kk + 1][3]);
    } else {
      kd_ldmatrix_x4(a[mf], sp_addr + p_lane.at(kk / 4, kk % 4) + mf * 16 * P_ROW_CHUNKS * 16);
    }
  }
}

// The e4m3 MMA path's P V (kv_fp8.cuh), in k32 slices of 32 tokens. P's rows in
// shared memory (column warps > 1) are BLOCK_N bytes, each 16-token group in the
// k-slot order of the V fragments: token 2t + c at byte 4t + c, token 8 + 2t + c
// at byte 4t + 2 + c.
constexpr int P8_CHUNKS = BLOCK_N / 16;
constexpr int PV8_STEPS = BLOCK_N / 32 * PV_PAIRS;
static_assert(!MMA_E4M3 || BLOCK_N % 32 == 0, "the e4m3 MMA path steps 32 tokens");

// Byte offset in P's rows of the e4m3 pair for the columns 2t, 2t + 1 of n8 tile
// jj (of the tile's BLOCK_N / 8) in row `row`.
static __device__ __forceinline__ kd_u32 p8_offset(int row, int jj, int t) {
  return (row * P8_CHUNKS + kv_chunk<P8_CHUNKS>(row, jj / 2)) * 16 + 4 * t + 2 * (jj % 2);
}

// P's A fragments of slice kk: packed from the S accumulators (one column warp:
// tiles 4kk .. 4kk+3 are lane (g, t)'s tokens in k-slot order) or loaded.
static __device__ __forceinline__ void load_p8_frags(kd_u32 (&a)[MF][4], int kk, const float (&s)[MF][S_TILES][4],
                                                     kd_u32 sp_addr, const LaneRow<P8_CHUNKS>& p_lane) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
    if (WARPS_N == 1) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 4 * kk + 2 * half;
        a[mf][2 * half] = kd_e4m3x4_pack(s[mf][j][0], s[mf][j][1], s[mf][j + 1][0], s[mf][j + 1][1]);
        a[mf][2 * half + 1] = kd_e4m3x4_pack(s[mf][j][2], s[mf][j][3], s[mf][j + 1][2], s[mf][j + 1][3]);
      }
    } else {
      kd_ldmatrix_x4(a[mf], sp_addr + p_lane.at(kk / 4, kk % 4) + mf * 16 * P8_CHUNKS * 16);
    }
  }
}

// Step's V fragments: the even and odd dims of 16-dim block jp (n8 tiles 2jp and
// 2jp + 1) for the 32 tokens of slice kk. v_row: this lane's token row (lane) in
// bytes; ROW_CHUNKS the rows' stride.
template <int ROW_CHUNKS>
static __device__ __forceinline__ void load_v8_frag(kd_u32 (&b)[4], int step, kd_u32 tv, kd_u32 v_row, int lane) {
  const int kk = step / PV_PAIRS, jp = step % PV_PAIRS;
  kd_u32 r[4];
  kd_ldmatrix_x4_trans(r, tv + kk * 32 * ROW_CHUNKS * 16 + v_row + kv_chunk<ROW_CHUNKS>(lane, jp) * 16);
  b[0] = __byte_perm(r[0], r[1], E4M3_EVEN_OF_PAIR);
  b[1] = __byte_perm(r[2], r[3], E4M3_EVEN_OF_PAIR);
  b[2] = __byte_perm(r[0], r[1], E4M3_ODD_OF_PAIR);
  b[3] = __byte_perm(r[2], r[3], E4M3_ODD_OF_PAIR);
}

// ---- Phases of the kernel (see kdtree_verify_attention). A thread holds, per m16
// fragment mf, rows lane / 4 (h = 0) and lane / 4 + 8 (h = 1) of the fragment,
// and per n8 tile the columns 2 * (lane % 4) + {0, 1}.

// The CTA row exchange: the WARPS_N column warps of a warp row combine a per-row
// value through shared memory, as a max (SUM false: from the thread's own value,
// folding warp by warp) or a sum (SUM true: of every warp's value, row fragment by
// row fragment). Those fold orders are the ones the kernel was tuned with. The
// caller makes sure no thread still reads sred from an earlier exchange.
template <bool SUM>
static __device__ __forceinline__ void cta_row_exchange(float (&v)[MF][2], float* sred, int wm, int wn, int lane) {
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
      sred[wn * BLOCK_M + wm * WARP_ROWS + mf * 16 + lane / 4] = v[mf][0];
      sred[wn * BLOCK_M + wm * WARP_ROWS + mf * 16 + lane / 4 + 8] = v[mf][1];
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < MF * WARPS_N; ++i) {
    const int mf = SUM ? i / WARPS_N : i % MF;
    const int w = SUM ? i % WARPS_N : i / MF;
    if (SUM && w == 0) v[mf][0] = v[mf][1] = 0.f;
    const float r0 = sred[w * BLOCK_M + wm * WARP_ROWS + mf * 16 + lane / 4];
    const float r1 = sred[w * BLOCK_M + wm * WARP_ROWS + mf * 16 + lane / 4 + 8];
    v[mf][0] = SUM ? v[mf][0] + r0 : fmaxf(v[mf][0], r0);
    v[mf][1] = SUM ? v[mf][1] + r1 : fmaxf(v[mf][1], r1);
  }
}

// Online softmax: P = exp2(S * scale - m) in place, l and the reference max m
// updated (lazy_max_update), alpha the factor O must be rescaled by. Returns
// whether any of this thread's alphas is not 1.
static __device__ __forceinline__ bool online_softmax(float (&s)[MF][S_TILES][4], const float (&mx)[MF][2],
                                                      float (&m_run)[MF][2], float (&l_run)[MF][2],
                                                      float (&alpha)[MF][2], float scale_log2) {
  bool rescale = false;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_use = lazy_max_update(mx[mf][h], scale_log2, m_run[mf][h], l_run[mf][h], alpha[mf][h]);
      rescale |= alpha[mf][h] != 1.f;
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[mf][j][2 * h + c] = lazy_exp(s[mf][j][2 * h + c], scale_log2, m_use);
          l_run[mf][h] += s[mf][j][2 * h + c];
        }
      }
    }
  }
  return rescale;
}


// The kernel reads as its phases: the Q tile, then per KV tile QK, mask and row
// max, the CTA row exchange, online softmax, PV; then the row sums (the exchange
// again) and writing rows. The exchange, the softmax and the phases both kernels
// share (verify_attention_common.cuh) are functions; QK, PV and the mask loop stay
// inline because moving them into functions changed the SASS ptxas emits
// (register assignment and schedule, measured), which this kernel's performance
// model reads.
extern "C" __global__ void __launch_bounds__(THREADS, 1) kdtree_verify_attention(const kdtree_verify_params p) {
  kd_launch_dependents();  // the split combine may launch now; it waits for this grid's writes
  // The carve-up is the generator's (verify_smem_layout), which also sizes the launch.
  extern __shared__ __align__(128) unsigned char smem_raw[];
  kd_u16* sq = (kd_u16*)smem_raw;
  kd_u16* sk = (kd_u16*)(smem_raw + SMEM_K);
  kd_u16* sv = (kd_u16*)(smem_raw + SMEM_V);
  kd_u16* sp = (kd_u16*)(smem_raw + SMEM_P);
  float* sred = (float*)(smem_raw + SMEM_RED);  // [WARPS_N][BLOCK_M]
  float* sq_scale = (float*)(smem_raw + SMEM_Q_SCALE);  // [BLOCK_M]: the e4m3 MMA path's Q row scales
  constexpr kd_u32 K_TILE_BYTES = KV_K_TILE_BYTES, V_TILE_BYTES = KV_V_TILE_BYTES;
  const kd_u32 sq_addr = kd_smem_addr(sq), sk_addr = kd_smem_addr(sk), sv_addr = kd_smem_addr(sv);

  const int m_tile = blockIdx.x;
  const int b = blockIdx.y / p.num_kv_heads;
  const int kv_head = blockIdx.y % p.num_kv_heads;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  const Request req = load_request(p, b);
  if (!req.valid) {
    // Malformed request: one CTA per (request, kv head) writes NaN to every row the
    // request claims (within the node arrays), so nothing stale is left behind.
    if (m_tile == 0 && split == 0) {
      if (p.error_flags && threadIdx.x == 0) atomicOr(p.error_flags, request_errors(p, req));
      poison_request(p, req, kv_head);
    }
    return;
  }
  const int rows_total = req.n_nodes * p.group;
  const int row0 = m_tile * BLOCK_M;
  if (row0 >= rows_total) return;
  const int t_begin = split * p.split_tokens;
  const int t_end = min(req.kv_len, t_begin + p.split_tokens);
  if (t_begin >= t_end) return;  // the combine kernel skips splits past kv_len

  // ---- Q tile: rows past the request's rows are zero-filled (their results are dropped)
  if constexpr (MMA_E4M3) {
    load_q_tile_e4m3(p, req, row0, rows_total, kv_head, sq_addr, sq_scale);
  } else if constexpr (KV_FP8) {
    load_q_tile_kv_fp8(p, req, row0, rows_total, kv_head, sq_addr);
  } else {
    load_q_tile(p, req, row0, rows_total, kv_head, sq_addr);
  }

  // ---- the tree node of each of this thread's rows (fragment mf, half h: row
  // lane / 4 + 8 h of the fragment), -1 past the request's rows. The mask words
  // are read (L1) only on edge tiles, so they hold no registers through the loop.
  int row_node[MF][2];
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int gr = row0 + wm * WARP_ROWS + mf * 16 + lane / 4 + h * 8;
      row_node[mf][h] = gr < rows_total ? req.node_base + gr / p.group : -1;
    }
  }

  bool bad_page = false;
  KvSource kv_src;
  kv_src.k_base = (const char*)p.k_cache + (long long)kv_head * HEAD_DIM * KV_ELEM_BYTES;
  kv_src.v_base = (const char*)p.v_cache + (long long)kv_head * HEAD_DIM_V * KV_ELEM_BYTES;
  kv_src.k_slot_bytes = (unsigned long long)p.num_kv_heads * HEAD_DIM * KV_ELEM_BYTES;
  kv_src.v_slot_bytes = (unsigned long long)p.num_kv_heads * HEAD_DIM_V * KV_ELEM_BYTES;
  kv_src.pages = p.page_table + (long long)b * p.max_pages_per_req;
  const int n_tiles = (t_end - t_begin + BLOCK_N - 1) / BLOCK_N;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_tiles)
      load_kv_tile(p, kv_src, t_begin + s * BLOCK_N, t_end, sk_addr + s * K_TILE_BYTES, sv_addr + s * V_TILE_BYTES,
                   bad_page);
    kd_cp_async_commit();  // the Q copies ride in the first group
  }

  float o[MF][O_TILES][4];
  zero_frags(o);
  float m_run[MF][2], l_run[MF][2];  // reference row max (log2 domain, see LAZY_MAX_LOG2); this thread's share of the row sum
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
    m_run[mf][0] = m_run[mf][1] = -KD_INF;
    l_run[mf][0] = l_run[mf][1] = 0.f;
  }

  // The e4m3 MMA path: the scores' per-row factor, Q's row scale (after the barrier
  // that publishes the quantised tile).
  float q_row_scale[MF][2];
  if constexpr (MMA_E4M3) {
    __syncthreads();
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
      for (int h = 0; h < 2; ++h) q_row_scale[mf][h] = sq_scale[wm * WARP_ROWS + mf * 16 + lane / 4 + h * 8];
    }
  }

  const int q_row = wm * WARP_ROWS + (lane & 15);  // fragment mf adds 16 rows: the same swizzle phase
  const int s_col0 = wn * (BLOCK_N / WARPS_N);
  constexpr int V_ROW_CHUNKS = IS_MLA ? QK_CHUNKS : V_CHUNKS;
  const kd_u32 sp_addr = kd_smem_addr(sp);
  const LaneRow<QK_CHUNKS> q_lane(q_row, lane >> 4);                                         // A of S
  const LaneRow<QK_CHUNKS> k_lane(s_col0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);  // B of S
  const LaneRow<V_ROW_CHUNKS> v_lane((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);           // B of O
  const LaneRow<P_CHUNKS> p_lane(q_row, lane >> 4);                                          // A of O
  const kd_u32 v_col_bytes = (wn * V_COLS * KV_ELEM_BYTES / 16) * 16;  // a multiple of 128: the swizzle group is kept
  // e4m3 caches: this lane's K and V rows in the fragment loads (kv_fp8.cuh).
  constexpr int V_ROW_CHUNKS_KV = IS_MLA ? KV_K_ROW_CHUNKS : KV_V_ROW_CHUNKS;
  const kd_u32 kf_row = (s_col0 + (lane & 15)) * KV_K_ROW_CHUNKS * 16;
  const kd_u32 kf_odd = (s_col0 + (S_TILES - 1) * 8 + (lane & 7)) * KV_K_ROW_CHUNKS * 16;
  const kd_u32 vf_row = (lane & 15) * V_ROW_CHUNKS_KV * 16;
  // The e4m3 MMA path: Q, K, P and V rows of e4m3 codes (kv_fp8.cuh).
  const LaneRow<Q8_ROW_CHUNKS> q8_lane(q_row, lane >> 4);
  const LaneRow<KV_K_ROW_CHUNKS> k8_lane(s_col0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const LaneRow<P8_CHUNKS> p8_lane(q_row, lane >> 4);
  const kd_u32 v8_row = lane * V_ROW_CHUNKS_KV * 16;

  for (int it = 0; it < n_tiles; ++it) {
    kd_cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      int next = it + STAGES - 1;
      if (next < n_tiles) {
        int st = next % STAGES;
        load_kv_tile(p, kv_src, t_begin + next * BLOCK_N, t_end, sk_addr + st * K_TILE_BYTES,
                     sv_addr + st * V_TILE_BYTES, bad_page);
      }
      kd_cp_async_commit();
    }
    const int stage = it % STAGES;
    const kd_u32 tk_addr = sk_addr + stage * K_TILE_BYTES;
    const kd_u32 tv_addr = (IS_MLA ? tk_addr : sv_addr + stage * V_TILE_BYTES) + v_col_bytes;
    const int t0 = t_begin + it * BLOCK_N;

    // ---- S = Q K^T for this warp's WARP_ROWS rows x BLOCK_N / WARPS_N columns
    float s[MF][S_TILES][4];
    zero_frags(s);
    // Fragments are double-buffered in registers: step k + 1's ldmatrix are issued
    // before step k's mma, so their latency hides under the mma (the schedule ptxas
    // picks for the plain loop too; written out so the source says what it relies on).
    QkFrags qf[2];
    if constexpr (MMA_E4M3) {
      constexpr int QK8_STEPS = HEAD_DIM / 32;
      load_qk_frags(qf[0], 0, sq_addr, tk_addr, q8_lane, k8_lane);
#pragma unroll
      for (int k = 0; k < QK8_STEPS; ++k) {
        if (k + 1 < QK8_STEPS) load_qk_frags(qf[(k + 1) & 1], k + 1, sq_addr, tk_addr, q8_lane, k8_lane);
        qk_mma<true>(s, qf[k & 1]);
      }
    } else {
      if constexpr (KV_FP8) {
        load_qk_frags_kv_fp8(qf[0], 0, sq_addr, tk_addr, q_lane, kf_row, kf_odd, lane);
      } else {
        load_qk_frags(qf[0], 0, sq_addr, tk_addr, q_lane, k_lane);
      }
#pragma unroll
      for (int k = 0; k < QK_STEPS; ++k) {
        if constexpr (KV_FP8) {
          if (k + 1 < QK_STEPS) load_qk_frags_kv_fp8(qf[(k + 1) & 1], k + 1, sq_addr, tk_addr, q_lane, kf_row, kf_odd, lane);
        } else {
          if (k + 1 < QK_STEPS) load_qk_frags(qf[(k + 1) & 1], k + 1, sq_addr, tk_addr, q_lane, k_lane);
        }
        qk_mma<false>(s, qf[k & 1]);
      }
    }
    // ---- mask (prefix visible; tree tokens by the mask bits; past t_end hidden) and
    // row max on the raw scores: the scale is positive (checked by the host), so it
    // is applied once per row max and folded into the exponent's FFMA.
    const bool edge = is_edge_tile(t0, req, t_end);
    float mx[MF][2];
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[mf][h] = -KD_INF;
        kd_u64 words[MASK_WORDS];
        if (edge) {
#pragma unroll
          for (int w = 0; w < MASK_WORDS; ++w)
            words[w] = row_node[mf][h] >= 0 ? __ldg(p.tree_mask + (long long)row_node[mf][h] * MASK_WORDS + w) : 0ull;
        }
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float v = s[mf][j][2 * h + c];
            if constexpr (MMA_E4M3) v *= q_row_scale[mf][h];
            if (edge) {
              // token_visible() written out: as a call, ptxas schedules this loop with
              // 80 more instructions on sm_90 (scripts/sass_diff.sh).
              int t = t0 + s_col0 + j * 8 + (lane & 3) * 2 + c;
              int tree = t - req.prefix;
              bool visible = t < t_end && (tree < 0 || mask_bit(words, tree));
              v = visible ? v : -KD_INF;
            }
            s[mf][j][2 * h + c] = v;
            mx[mf][h] = fmaxf(mx[mf][h], v);
          }
        }
        mx[mf][h] = fmaxf(mx[mf][h], __shfl_xor_sync(0xffffffffu, mx[mf][h], 1));
        mx[mf][h] = fmaxf(mx[mf][h], __shfl_xor_sync(0xffffffffu, mx[mf][h], 2));
      }
    }
    // ---- the CTA row exchange of the row max (column warps > 1)
    if (WARPS_N > 1) cta_row_exchange<false>(mx, sred, wm, wn, lane);
    // ---- online softmax; once the reference maxima settle, alpha is 1 for the
    // whole warp and the O_TILES * 4 rescales are skipped.
    float alpha[MF][2];
    const bool rescale = online_softmax(s, mx, m_run, l_run, alpha, p.scale_log2);
    if (__any_sync(0xffffffffu, rescale)) rescale_o(o, alpha);

    // ---- O += P V (P through shared memory when the row's columns span warps)
    if (WARPS_N > 1) {
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
          int col = s_col0 + j * 8 + (lane & 3) * 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            int row = wm * WARP_ROWS + mf * 16 + lane / 4 + h * 8;
            if constexpr (MMA_E4M3) {
              *(kd_u16*)((unsigned char*)sp + p8_offset(row, col / 8, lane & 3)) =
                  kd_e4m3x2_pack(s[mf][j][2 * h], s[mf][j][2 * h + 1]);
            } else {
              kd_u32* dst = (kd_u32*)(sp + swizzle<P_CHUNKS>(row, col / 8) * 8 + col % 8);
              *dst = kd_pack2<IS_BF16>(s[mf][j][2 * h], s[mf][j][2 * h + 1]);
            }
          }
        }
      }
      __syncthreads();
    }
    if constexpr (MMA_E4M3) {
      kd_u32 pa[2][MF][4], vb[2][4];
      load_p8_frags(pa[0], 0, s, sp_addr, p8_lane);
      load_v8_frag<V_ROW_CHUNKS_KV>(vb[0], 0, tv_addr, v8_row, lane);
#pragma unroll
      for (int step = 0; step < PV8_STEPS; ++step) {
        const int kk = step / PV_PAIRS, jp = step % PV_PAIRS;
        if (jp == 0 && kk + 1 < BLOCK_N / 32) load_p8_frags(pa[(kk + 1) & 1], kk + 1, s, sp_addr, p8_lane);
        if (step + 1 < PV8_STEPS) load_v8_frag<V_ROW_CHUNKS_KV>(vb[(step + 1) & 1], step + 1, tv_addr, v8_row, lane);
        const kd_u32(&b)[4] = vb[step & 1];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          mma_step<true>(o[mf][2 * jp], pa[kk & 1][mf], b[0], b[1]);
          mma_step<true>(o[mf][2 * jp + 1], pa[kk & 1][mf], b[2], b[3]);
        }
      }
    } else {
      kd_u32 pa[2][MF][4], vb[2][4];
      load_p_frags(pa[0], 0, s, sp_addr, p_lane);
      if constexpr (KV_FP8) {
        load_v_frag_kv_fp8<V_ROW_CHUNKS_KV>(vb[0], 0, tv_addr, vf_row, lane);
      } else {
        load_v_frag(vb[0], 0, tv_addr, v_lane);
      }
#pragma unroll
      for (int step = 0; step < PV_STEPS; ++step) {
        const int kk = step / PV_PAIRS, jp = step % PV_PAIRS;
        if (jp == 0 && kk + 1 < BLOCK_N / 16) load_p_frags(pa[(kk + 1) & 1], kk + 1, s, sp_addr, p_lane);
        if constexpr (KV_FP8) {
          if (step + 1 < PV_STEPS) load_v_frag_kv_fp8<V_ROW_CHUNKS_KV>(vb[(step + 1) & 1], step + 1, tv_addr, vf_row, lane);
        } else {
          if (step + 1 < PV_STEPS) load_v_frag(vb[(step + 1) & 1], step + 1, tv_addr, v_lane);
        }
        const kd_u32(&b)[4] = vb[step & 1];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          kd_mma16816<IS_BF16>(o[mf][2 * jp], pa[kk & 1][mf], b[0], b[1]);
          kd_mma16816<IS_BF16>(o[mf][2 * jp + 1], pa[kk & 1][mf], b[2], b[3]);
        }
      }
    }
  }
  kd_cp_async_wait<0>();

  // ---- row sums: the quad, then the warps of the row
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[mf][h] += __shfl_xor_sync(0xffffffffu, l_run[mf][h], 1);
      l_run[mf][h] += __shfl_xor_sync(0xffffffffu, l_run[mf][h], 2);
    }
  }
  if (WARPS_N > 1) {
    __syncthreads();  // every warp has read the last tile's max exchange
    cta_row_exchange<true>(l_run, sred, wm, wn, lane);
  }
  // A bad page or request poisons its rows with NaN (the flag says why).
  const bool poisoned = bad_page_seen(p, bad_page);

  // ---- writing rows: O / l as 16-bit out and the natural-log LSE, or with split
  // KV the 16-bit partials and the log2-domain LSE for kdtree_verify_combine.
  const bool partial = p.num_splits > 1;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int gr = row0 + wm * WARP_ROWS + mf * 16 + lane / 4 + h * 8;
      if (gr >= rows_total) continue;
      const long long orow = out_row(p, req.node_base, gr, kv_head * p.group);
      const long long prow = partial ? (long long)split * p.total_nodes * p.num_q_heads + orow : -1;
      write_row(p, o[mf], h, orow, prow, l_run[mf][h], m_run[mf][h], poisoned, wn * V_COLS + (lane & 3) * 2,
                wn == 0 && (lane & 3) == 0);
    }
  }
}
