// What the verify_attention kernels share: the shape constants, request metadata
// and its checks, the paged KV tile copy, shared-memory swizzles, and the split
// combine kernel. Included by each verify_attention template after its config
// header (the KD_* values below come from there), so the kernels read the same
// requests, pages and partials the same way.
#ifndef KDTREE_VERIFY_ATTENTION_COMMON_CUH
#define KDTREE_VERIFY_ATTENTION_COMMON_CUH

#include "common.cuh"
#include "kv_fp8.cuh"
#include "verify_attention_params.h"
#include "verify_attention_layout.h"

constexpr int HEAD_DIM = KD_HEAD_DIM_QK;
constexpr int HEAD_DIM_V = KD_HEAD_DIM_V;
constexpr int PAGE_SIZE = KD_PAGE_SIZE;
constexpr int MAX_TREE_NODES = KD_MAX_TREE_NODES;
constexpr bool IS_MLA = KD_IS_MLA;  // V = the first HEAD_DIM_V dims of the K row
constexpr bool IS_BF16 = KD_IS_BF16;
constexpr int BLOCK_M = KD_BLOCK_M;
constexpr int BLOCK_N = KD_BLOCK_N;
constexpr int WARPS_M = KD_WARPS_M;
constexpr int WARPS_N = KD_WARPS_N;
constexpr int WARP_ROWS = KD_WARP_ROWS;
constexpr int STAGES = KD_STAGES;
constexpr int MF = WARP_ROWS / 16;  // m16 fragments per warp

constexpr int MASK_WORDS = (MAX_TREE_NODES + 63) / 64;
constexpr float LAZY_MAX_LOG2 = 8.f;
constexpr int THREADS = WARPS_M * WARPS_N * 32;
constexpr int QK_CHUNKS = HEAD_DIM / 8;     // 16-byte chunks per Q/K row
constexpr int V_CHUNKS = HEAD_DIM_V / 8;
// The KV caches' rows in shared memory, in 16-byte chunks: as cached (e4m3: one
// byte an element, see kv_fp8.cuh), a row longer than one 8-chunk swizzle group
// padded to whole groups (MLA e4m3: 36 chunks at a stride of 40).
constexpr bool KV_FP8 = KD_KV_FP8;
constexpr int KV_ELEM_BYTES = KV_FP8 ? 1 : 2;
// QK and PV on e4m3 MMAs (Q and P quantised; kv_fp8.cuh), the block-scaled form on sm_120a.
constexpr bool MMA_E4M3 = KD_MMA_E4M3;
constexpr bool MMA_BLOCK_SCALED = KD_MMA_BLOCK_SCALED;
static_assert(KV_FP8 || !MMA_E4M3, "the e4m3 MMA path reads e4m3 caches");
constexpr int KV_K_CHUNKS = HEAD_DIM * KV_ELEM_BYTES / 16;  // copied per K row
constexpr int KV_V_CHUNKS = HEAD_DIM_V * KV_ELEM_BYTES / 16;
// Packed rows (the qsplit kernel's e4m3 MMA path, whose fourth stage needs the 64
// bytes a row that padding takes): MLA's 36 chunks unpadded, swizzled within
// aligned groups of 4 chunks (kv_chunk).
constexpr bool KV_ROWS_PACKED = KD_KV_ROWS_PACKED;
static_assert(!KV_ROWS_PACKED || (KV_FP8 && IS_MLA && KV_K_CHUNKS % 8 == 4), "packed rows: MLA's 36-chunk e4m3 rows");
__host__ __device__ constexpr int kv_row_stride(int chunks) {
  return chunks > 8 && !KV_ROWS_PACKED ? (chunks + 7) / 8 * 8 : chunks;
}
constexpr int KV_K_ROW_CHUNKS = kv_row_stride(KV_K_CHUNKS);
constexpr int KV_V_ROW_CHUNKS = kv_row_stride(KV_V_CHUNKS);
constexpr kd_u32 KV_K_TILE_BYTES = BLOCK_N * KV_K_ROW_CHUNKS * 16;
constexpr kd_u32 KV_V_TILE_BYTES = IS_MLA ? 0 : BLOCK_N * KV_V_ROW_CHUNKS * 16;
static_assert(BLOCK_M == WARPS_M * WARP_ROWS && WARP_ROWS % 16 == 0, "a warp row owns WARP_ROWS rows");
static_assert(IS_MLA || HEAD_DIM_V == HEAD_DIM, "GQA: V rows as wide as K rows");
static_assert(QK_CHUNKS % 8 == 0 && (IS_MLA || V_CHUNKS % 8 == 0), "rows swizzle in groups of 8 chunks");
static_assert(KV_FP8 || (KV_K_ROW_CHUNKS == QK_CHUNKS && KV_K_TILE_BYTES == BLOCK_N * HEAD_DIM * 2), "16-bit rows unpadded");
// A K/V row of whole swizzle groups, or one row of at most 8 chunks (unswizzled).
// A packed row of 36 chunks (a multiple of 4, not of 8): a row starts half a
// 128-byte line after the one before it every other row, so XOR-ing the low two
// chunk bits with row / 2 puts 8 consecutive rows' same chunk in 8 distinct
// 16-byte bank groups, and keeps every chunk inside its row.
template <int CHUNKS>
static __device__ __forceinline__ int kv_chunk(int row, int chunk) {
  if constexpr (CHUNKS > 8 && CHUNKS % 8 == 4) return chunk ^ ((row >> 1) & 3);
  return CHUNKS >= 8 ? ((chunk ^ row) & 7) | (chunk & ~7) : chunk;
}

// Shared-memory rows (Q, K, V, P) are XOR-swizzled in 16-byte chunks so ldmatrix reads are free of bank conflicts.
template <int CHUNKS>
static __device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * CHUNKS + (CHUNKS >= 8 ? (chunk ^ (row & 7)) : chunk);
}

// Bit j of a row's mask words; the word is picked with compile-time indices so
// the words stay in registers.
static __device__ __forceinline__ bool mask_bit(const kd_u64 (&words)[MASK_WORDS], int j) {
  kd_u64 w = words[0];
#pragma unroll
  for (int i = 1; i < MASK_WORDS; ++i) w = (j >> 6) == i ? words[i] : w;
  return (w >> (j & 63)) & 1ull;
}

// ldmatrix addresses without per-load index math: a lane reads chunk 2 * kk + h
// of row r, so the swizzled byte offset splits into a per-thread part, computed
// once (row base and the four XOR patterns of kk % 4), and (kk / 4) * 128.
template <int CHUNKS>
struct LaneRow {
  kd_u32 base;   // row * CHUNKS * 16
  kd_u32 xo[4];  // byte offset of chunk 2 * i + h within an 8-chunk group
  __device__ __forceinline__ LaneRow(int row, int h) {
    base = row * CHUNKS * 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) xo[i] = (CHUNKS >= 8 ? ((2 * i + h) ^ (row & 7)) : (2 * i + h)) * 16;
  }
  // Offset of chunk 2 * (4 * k4 + i) + h; i must be a compile-time index.
  __device__ __forceinline__ kd_u32 at(int k4, int i) const { return base + k4 * 128 + xo[i]; }
};

struct Request {
  int node_base;  // first node of the request in the packed node arrays
  int n_nodes;
  int kv_len;
  int prefix;     // kv_len - n_nodes: the tree starts here
  bool valid;
};

// KDTREE_DEVICE_ERROR_* bits for a request's metadata (0 = well formed).
static __device__ __forceinline__ int request_errors(const kdtree_verify_params& p, const Request& r) {
  int flag = 0;
  if (r.n_nodes < 1 || r.n_nodes > MAX_TREE_NODES || r.prefix < 0 || r.node_base < 0 ||
      r.node_base + r.n_nodes > p.total_nodes) {
    flag |= KDTREE_DEVICE_ERROR_NODE_COUNT;
  }
  if (r.kv_len > p.max_kv_len || (r.kv_len + PAGE_SIZE - 1) / PAGE_SIZE > p.max_pages_per_req) {
    flag |= KDTREE_DEVICE_ERROR_KV_LEN;
  }
  return flag;
}

static __device__ __forceinline__ Request load_request(const kdtree_verify_params& p, int b) {
  Request r;
  r.node_base = p.node_indptr[b];
  r.n_nodes = p.node_indptr[b + 1] - r.node_base;
  r.kv_len = p.kv_lens[b];
  r.prefix = r.kv_len - r.n_nodes;
  r.valid = request_errors(p, r) == 0;
  return r;
}

static __device__ void poison_request(const kdtree_verify_params& p, const Request& r, int kv_head) {
  const int first = max(r.node_base, 0);
  const int last = min(r.node_base + max(r.n_nodes, 0), p.total_nodes);
  kd_u16* out = (kd_u16*)p.out;
  const kd_u16 nan16 = IS_BF16 ? 0x7fc0 : 0x7e00;
  for (long long i = threadIdx.x; i < (long long)(last - first) * p.group * HEAD_DIM_V; i += THREADS) {
    long long row = i / HEAD_DIM_V;
    long long orow = (long long)(first + row / p.group) * p.num_q_heads + kv_head * p.group + row % p.group;
    out[orow * HEAD_DIM_V + i % HEAD_DIM_V] = nan16;
    if (p.lse && i % HEAD_DIM_V == 0) p.lse[orow] = KD_NAN;
  }
}

// Issues the cp.async copies of one KV tile (tokens t0 .. t0 + BLOCK_N) into a
// stage (shared-memory byte addresses). A token row is copied by ROW_LANES lanes,
// so the page-table lookup and the row address are computed once per row.
// Tokens at or past t_end are zero-filled: masked scores give P = 0, and 0 * 0 stays 0.
// Few lanes per row (a thread computes few row addresses), 16 where 8 would leave
// threads without a row.
constexpr int ROW_LANES = THREADS / 8 > BLOCK_N ? 16 : 8;
constexpr int ROWS_PER_PASS = THREADS / ROW_LANES;
static_assert(ROW_LANES % 8 == 0 && (IS_MLA || KV_V_CHUNKS == KV_K_CHUNKS), "row copies keep the 8-chunk swizzle");

// Per-CTA constants of the KV tile loads, so a token row costs one page-table
// read, one multiply for its address and the cp.async instructions.
struct KvSource {
  const char* k_base;        // k_cache at this KV head (bytes)
  const char* v_base;        // v_cache at this KV head (GQA)
  unsigned long long k_slot_bytes;  // bytes between token slots of the K cache
  unsigned long long v_slot_bytes;
  const int* pages;          // this request's page-table row
};

// Request b's K/V rows at a KV head: token slots num_kv_heads heads apart; MLA's V is the
// first HEAD_DIM_V dims of the K row (v_cache is NULL).
static __device__ __forceinline__ KvSource kv_source(const kdtree_verify_params& p, int b, int kv_head) {
  KvSource src;
  src.k_base = (const char*)p.k_cache + (long long)kv_head * HEAD_DIM * KV_ELEM_BYTES;
  src.k_slot_bytes = (unsigned long long)p.num_kv_heads * HEAD_DIM * KV_ELEM_BYTES;
  if constexpr (IS_MLA) {
    src.v_base = src.k_base;
    src.v_slot_bytes = src.k_slot_bytes;
  } else {
    src.v_base = (const char*)p.v_cache + (long long)kv_head * HEAD_DIM_V * KV_ELEM_BYTES;
    src.v_slot_bytes = (unsigned long long)p.num_kv_heads * HEAD_DIM_V * KV_ELEM_BYTES;
  }
  src.pages = p.page_table + (long long)b * p.max_pages_per_req;
  return src;
}

static __device__ __forceinline__ void load_kv_tile(const kdtree_verify_params& p, const KvSource& src, int t0,
                                                    int t_end, kd_u32 sk, kd_u32 sv, bool& bad_page) {
  const int lane_chunk = threadIdx.x % ROW_LANES;  // a multiple of 8 lanes per row: the XOR swizzle
  for (int row = threadIdx.x / ROW_LANES; row < BLOCK_N; row += ROWS_PER_PASS) {  // touches lane_chunk's low bits only
    const unsigned t = unsigned(t0 + row);
    const bool in_range = t < unsigned(t_end);
    const unsigned page = in_range ? unsigned(__ldg(src.pages + t / PAGE_SIZE)) : 0u;
    const bool ok = in_range && page < unsigned(p.num_pages);  // a negative id fails too
    bad_page |= in_range && !ok;
    const unsigned long long slot = ok ? (unsigned long long)(page * PAGE_SIZE + t % PAGE_SIZE) : 0ull;
    const int bytes = ok ? 16 : 0;
    // Packed rows swizzle within 4-chunk groups, so chunk0 + k * ROW_LANES is chunk lane_chunk + k * ROW_LANES's too.
    const int chunk0 = KV_ROWS_PACKED          ? kv_chunk<KV_K_ROW_CHUNKS>(row, lane_chunk)
                       : KV_K_ROW_CHUNKS >= 8 ? ((lane_chunk ^ row) & 7) | (lane_chunk & ~7)
                                              : lane_chunk;
    const char* krow = src.k_base + slot * src.k_slot_bytes + lane_chunk * 16;
    const kd_u32 kdst = sk + (row * KV_K_ROW_CHUNKS + chunk0) * 16;
#pragma unroll
    for (int k = 0; k < (KV_K_CHUNKS + ROW_LANES - 1) / ROW_LANES; ++k) {
      if (lane_chunk + k * ROW_LANES < KV_K_CHUNKS) kd_cp_async16(kdst + k * ROW_LANES * 16, krow + k * ROW_LANES * 16, bytes);
    }
    if (!IS_MLA) {
      const char* vrow = src.v_base + slot * src.v_slot_bytes + lane_chunk * 16;
      const kd_u32 vdst = sv + (row * KV_V_ROW_CHUNKS + chunk0) * 16;
#pragma unroll
      for (int k = 0; k < (KV_V_CHUNKS + ROW_LANES - 1) / ROW_LANES; ++k) {
        if (lane_chunk + k * ROW_LANES < KV_V_CHUNKS) kd_cp_async16(vdst + k * ROW_LANES * 16, vrow + k * ROW_LANES * 16, bytes);
      }
    }
  }
}

// ---- Phases both verify kernels run the same way.

// Row gr of a request's (node, head) rows (node gr / group, query head head0 +
// gr % group, head0 the KV head's first query head) as a row of q, out and lse.
static __device__ __forceinline__ long long out_row(const kdtree_verify_params& p, int node_base, int gr, int head0) {
  return (long long)(node_base + gr / p.group) * p.num_q_heads + head0 + gr % p.group;
}

// Zeroes a thread's mma accumulators: N n8 tiles of each of its MF row fragments.
template <int N>
static __device__ __forceinline__ void zero_frags(float (&x)[MF][N][4]) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int j = 0; j < N; ++j) x[mf][j][0] = x[mf][j][1] = x[mf][j][2] = x[mf][j][3] = 0.f;
  }
}

// ---- Tile masking. Only edge tiles are masked: those that reach the tree part
// (t >= prefix) or run past the segment's end; every prefix token is visible.
static __device__ __forceinline__ bool is_edge_tile(int t0, const Request& req, int t_end) {
  return t0 + BLOCK_N > req.prefix || t0 + BLOCK_N > t_end;
}

// Whether KV token t is visible to the row whose mask words are `words`: a prefix
// token, or one of the node's ancestors (itself included), before t_end.
static __device__ __forceinline__ bool token_visible(int t, int t_end, const Request& req,
                                                     const kd_u64 (&words)[MASK_WORDS]) {
  const int tree = t - req.prefix;
  return t < t_end && (tree < 0 || mask_bit(words, tree));
}

// ---- The lazy online softmax of one row (log2 domain). The reference max m_run
// moves only when the row max passes it by more than LAZY_MAX_LOG2: P stays
// <= 2^LAZY_MAX_LOG2 (far inside every 16-bit type's range) and l shares the
// reference, so the result is the same while most tiles of a long prefix skip the
// O rescale. Given the tile's raw row max mx, updates m_run and scales l_run by
// alpha (the factor O must be rescaled by); returns the max P is taken against.
static __device__ __forceinline__ float lazy_max_update(float mx, float scale_log2, float& m_run, float& l_run,
                                                        float& alpha) {
  const float mx2 = mx * scale_log2;  // the scale is positive (checked by the host): applied once per row max
  const float m_new = mx2 > m_run + LAZY_MAX_LOG2 ? mx2 : m_run;
  const float m_use = m_new == -KD_INF ? 0.f : m_new;  // a fully masked row stays at zero
  alpha = kd_exp2(m_run - m_use);
  m_run = m_new;
  l_run *= alpha;
  return m_use;
}

// P of raw score s against m_use (the scale folded into the exponent's FFMA).
static __device__ __forceinline__ float lazy_exp(float s, float scale_log2, float m_use) {
  return kd_exp2(fmaf(s, scale_log2, -m_use));
}

// The CTA's Q tile (BLOCK_M rows from row0 of the request's rows) into shared
// memory at byte address sq, rows swizzled; rows past the request's rows are
// zero-filled (their results are dropped). cp.async: the caller commits and waits.
static __device__ __forceinline__ void load_q_tile(const kdtree_verify_params& p, const Request& req, int row0,
                                                   int rows_total, int kv_head, kd_u32 sq) {
  const kd_u16* q = (const kd_u16*)p.q;
  for (int i = threadIdx.x; i < BLOCK_M * QK_CHUNKS; i += THREADS) {
    int r = i / QK_CHUNKS, chunk = i % QK_CHUNKS;
    int gr = row0 + r;
    bool ok = gr < rows_total;
    long long qrow = ok ? out_row(p, req.node_base, gr, kv_head * p.group) : 0;
    kd_cp_async16(sq + swizzle<QK_CHUNKS>(r, chunk) * 16, q + qrow * HEAD_DIM + chunk * 8, ok ? 16 : 0);
  }
}

// load_q_tile for e4m3 caches: the same rows, each 16-dim group's dim pairs
// reordered to [0, 2, 4, 6, 1, 3, 5, 7] (kv_fp8.cuh: the k order of a dequantised
// K fragment). Plain loads and stores (cp.async cannot reorder within a chunk):
// visible after the caller's next barrier.
static __device__ __forceinline__ void load_q_tile_kv_fp8(const kdtree_verify_params& p, const Request& req, int row0,
                                                          int rows_total, int kv_head, kd_u32 sq) {
  constexpr int GROUPS = HEAD_DIM / 16;
  for (int i = threadIdx.x; i < BLOCK_M * GROUPS; i += THREADS) {
    const int r = i / GROUPS, g = i % GROUPS;
    const int gr = row0 + r;
    uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a;
    if (gr < rows_total) {
      const uint4* src = (const uint4*)((const kd_u16*)p.q + out_row(p, req.node_base, gr, kv_head * p.group) * HEAD_DIM + g * 16);
      a = src[0];
      b = src[1];
    }
    const uint4 lo = make_uint4(a.x, a.z, b.x, b.z), hi = make_uint4(a.y, a.w, b.y, b.w);
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(sq + swizzle<QK_CHUNKS>(r, 2 * g) * 16), "r"(lo.x),
                 "r"(lo.y), "r"(lo.z), "r"(lo.w));
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(sq + swizzle<QK_CHUNKS>(r, 2 * g + 1) * 16), "r"(hi.x),
                 "r"(hi.y), "r"(hi.z), "r"(hi.w));
  }
}

// The e4m3 MMA path (kv_fp8.cuh): Q rows quantised to e4m3 in shared memory, one
// fp32 scale per (node, head) row: scale = amax / 448 (0 for a zero row), code =
// e4m3(q x 448 / amax), rounded to nearest even. Rows laid out as the e4m3 K rows
// (Q8_ROW_CHUNKS = KV_K_ROW_CHUNKS 16-byte chunks, same swizzle), scales at sq_scale. A warp quantises a row: its
// lanes hold the row's 16-bit chunks, reduce the max, then store 8 codes each.
// Plain loads and stores: visible after the caller's next barrier.
constexpr int Q8_ROW_CHUNKS = KV_K_ROW_CHUNKS;
static __device__ __forceinline__ float kd_16_to_float(kd_u32 x) {  // the low 16 bits of q's type
  if (IS_BF16) return __uint_as_float(x << 16);
  float f;
  asm("{ .reg .b16 h; cvt.u16.u32 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(x));
  return f;
}
static __device__ __forceinline__ void load_q_tile_e4m3(const kdtree_verify_params& p, const Request& req, int row0,
                                                        int rows_total, int kv_head, kd_u32 sq, float* sq_scale) {
  constexpr int PER_LANE = (QK_CHUNKS + 31) / 32;  // 8-element chunks of a 16-bit row per lane
  const int lane = threadIdx.x % 32;
  for (int r = threadIdx.x / 32; r < BLOCK_M; r += THREADS / 32) {
    const int gr = row0 + r;
    const uint4* src =
        (const uint4*)((const kd_u16*)p.q + (gr < rows_total ? out_row(p, req.node_base, gr, kv_head * p.group) : 0) * HEAD_DIM);
    float v[PER_LANE][8];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int c = lane + 32 * i;
      uint4 w = make_uint4(0u, 0u, 0u, 0u);
      if (gr < rows_total && c < QK_CHUNKS) w = src[c];
      const kd_u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[i][e] = kd_16_to_float(words[e / 2] >> (16 * (e % 2)));
        amax = fmaxf(amax, fabsf(v[i][e]));
      }
    }
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0.f ? 448.f / amax : 0.f;
    if (lane == 0) sq_scale[r] = amax / 448.f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int c = lane + 32 * i;
      if (c >= QK_CHUNKS) continue;
      const kd_u32 lo = kd_e4m3x4_pack(v[i][0] * inv, v[i][1] * inv, v[i][2] * inv, v[i][3] * inv);
      const kd_u32 hi = kd_e4m3x4_pack(v[i][4] * inv, v[i][5] * inv, v[i][6] * inv, v[i][7] * inv);
      const kd_u32 dst = sq + (r * Q8_ROW_CHUNKS + kv_chunk<Q8_ROW_CHUNKS>(r, c / 2)) * 16 + (c % 2) * 8;
      asm volatile("st.shared.v2.u32 [%0], {%1,%2};\n" ::"r"(dst), "r"(lo), "r"(hi));
    }
  }
}

// O *= alpha per row: a thread's N_TILES n8 tiles of each of its MF row fragments
// (alpha[mf][h]: the factor of row half h).
template <int N_TILES>
static __device__ __forceinline__ void rescale_o(float (&o)[MF][N_TILES][4], const float (&alpha)[MF][2]) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int j = 0; j < N_TILES; ++j) {
      o[mf][j][0] *= alpha[mf][0];
      o[mf][j][1] *= alpha[mf][0];
      o[mf][j][2] *= alpha[mf][1];
      o[mf][j][3] *= alpha[mf][1];
    }
  }
}

// The stores of a thread's share of a row (out's 16-bit type) to `row`, global or shared.
template <int N_TILES, bool DIM_PAIRS = KV_FP8>
static __device__ __forceinline__ void store_row(kd_u16* row, const float (&o)[N_TILES][4], int h, float inv,
                                                 int col) {
  if constexpr (DIM_PAIRS) {
    const int col4 = col + col % 8;  // col is the tile's first column + 2t: 4t in the 16-dim block
#pragma unroll
    for (int jp = 0; jp < N_TILES / 2; ++jp) {
      *(uint2*)(row + col4 + jp * 16) =
          make_uint2(kd_pack2<IS_BF16>(o[2 * jp][2 * h] * inv, o[2 * jp + 1][2 * h] * inv),
                     kd_pack2<IS_BF16>(o[2 * jp][2 * h + 1] * inv, o[2 * jp + 1][2 * h + 1] * inv));
    }
  } else {
#pragma unroll
    for (int j = 0; j < N_TILES; ++j)
      *(kd_u32*)(row + col + j * 8) = kd_pack2<IS_BF16>(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
  }
}

// A thread's share of one output row: its N_TILES column pairs (n8 tiles of the mma
// C layout, row half h) from column col, scaled by 1 / l, as the 16-bit out and the
// natural-log LSE, or (prow >= 0) as the 16-bit partial and the log2-domain LSE of a
// split or stream-K piece. l is the row sum, m_ref its reference max (log2
// domain); lse_lane: the one lane of the row that writes the LSE.
// e4m3 caches: O is scaled by v_scale, and on the mma.sync dequantising path
// (DIM_PAIRS) the tiles come in (even dims, odd dims) pairs of a 16-dim block
// (kv_fp8.cuh): lane t's four columns 4t .. 4t+3 of block jp are
// o[2jp][2h], o[2jp+1][2h], o[2jp][2h+1], o[2jp+1][2h+1].
// PARTIAL_ROW: elements between partial rows (the qsplit cluster entry's padded stash).
template <int N_TILES, bool DIM_PAIRS = KV_FP8, int PARTIAL_ROW = HEAD_DIM_V>
static __device__ __forceinline__ void write_row(const kdtree_verify_params& p, const float (&o)[N_TILES][4], int h,
                                                 long long orow, long long prow, float l, float m_ref, bool poisoned,
                                                 int col, bool lse_lane) {
  float inv = l > 0.f ? 1.f / l : 0.f;
  if (poisoned) inv = KD_NAN;
  // log2-domain LSE of this row (over this split); -inf when nothing was visible.
  float lse2 = l > 0.f ? m_ref + kd_log2(l) : -KD_INF;
  if (poisoned) lse2 = KD_NAN;
  if (prow < 0 && l == 0.f && !poisoned) inv = KD_NAN;  // no visible token: a malformed mask
  if constexpr (KV_FP8) inv *= p.v_scale;
  // The stores: a split's partial row or the output row, both in out's 16-bit type.
  if (prow >= 0) {
    store_row<N_TILES, DIM_PAIRS>((kd_u16*)p.partial_o + prow * PARTIAL_ROW, o, h, inv, col);
    if (lse_lane) p.partial_lse[prow] = lse2;
  } else {
    store_row<N_TILES, DIM_PAIRS>((kd_u16*)p.out + orow * HEAD_DIM_V, o, h, inv, col);
    if (p.lse && lse_lane) p.lse[orow] = lse2 * 0.69314718055994531f;
  }
}

// ---- Stream-K (p.stream_ctas > 0). The work is a line of units, one per KV tile
// of an item; items are (request, KV head, row tile) in that order, each with its
// request's KV tiles. The line is cut into stream_ctas equal ranges of
// stream_chunk units, one per CTA, so every SM gets the same work whatever the
// batch's shape. A CTA runs its range as segments, one per item it touches: a
// segment that is a whole item writes its rows; the pieces of a cut item go to
// partial slots, 2c for CTA c's first segment and 2c + 1 for its last (a middle
// segment is always a whole item), which kdtree_verify_combine merges.
struct StreamRequest {
  int m_tiles;  // row tiles per KV head (1 for a malformed request: one segment per head poisons it)
  int tiles;    // KV tiles of each of its items (1 for a malformed request)
  __device__ long long units() const { return (long long)m_tiles * tiles; }
};

static __device__ __forceinline__ StreamRequest stream_request(const kdtree_verify_params& p, int b) {
  const Request r = load_request(p, b);
  StreamRequest s;
  s.m_tiles = r.valid ? (r.n_nodes * p.group + BLOCK_M - 1) / BLOCK_M : 1;
  s.tiles = r.valid ? (r.kv_len + BLOCK_N - 1) / BLOCK_N : 1;
  return s;
}

static __device__ __forceinline__ long long stream_chunk(const kdtree_verify_params& p, long long total) {
  return (total + p.stream_ctas - 1) / p.stream_ctas;
}

// The partial slot of CTA c's piece of an item that starts at unit u0.
static __device__ __forceinline__ long long stream_slot(long long c, long long chunk, long long u0) {
  return c * chunk >= u0 ? 2 * c : 2 * c + 1;
}

// The units of every request, scanned by the CTA (each thread sums a run of
// requests; `scan` is THREADS + 2 shared 64-bit words). Returns the total and
// sets first_b / first_unit to the request holding this CTA's first unit u (and
// that request's first unit); first_b = batch_size when u is past the total.
static __device__ __forceinline__ long long stream_scan(const kdtree_verify_params& p, long long* scan, long long& u,
                                                        int& first_b, long long& first_unit) {
  const int per = (p.batch_size + THREADS - 1) / THREADS;
  const int b0 = min(p.batch_size, (int)threadIdx.x * per), b1 = min(p.batch_size, b0 + per);
  long long sum = 0;
  for (int b = b0; b < b1; ++b) sum += stream_request(p, b).units() * p.num_kv_heads;
  if (threadIdx.x == 0) {
    scan[THREADS] = p.batch_size;
    scan[THREADS + 1] = 0;
  }
  scan[threadIdx.x] = sum;
  __syncthreads();
  for (int d = 1; d < THREADS; d *= 2) {  // inclusive scan (Hillis-Steele)
    const long long v = threadIdx.x >= d ? scan[threadIdx.x - d] : 0;
    __syncthreads();
    scan[threadIdx.x] += v;
    __syncthreads();
  }
  const long long total = scan[THREADS - 1];
  u = (long long)blockIdx.x * stream_chunk(p, total);
  long long unit = scan[threadIdx.x] - sum;  // this thread's first request's first unit
  if (u >= unit && u < unit + sum) {         // one thread's run holds u: it finds the request
    for (int b = b0; b < b1; ++b) {
      const long long n = stream_request(p, b).units() * p.num_kv_heads;
      if (u < unit + n) {
        scan[THREADS] = b;
        scan[THREADS + 1] = unit;
        break;
      }
      unit += n;
    }
  }
  __syncthreads();
  first_b = (int)scan[THREADS];
  first_unit = scan[THREADS + 1];
  __syncthreads();  // the scan words are free again
  return total;
}

// One piece of work of a CTA: KV tokens [t_begin, t_end) of the rows of row tile
// m_tile of (request b, kv_head), written as the final rows (partial_slot < 0),
// as split partials (uniform splits: partial_split >= 0), or to a stream-K slot.
struct Segment {
  int b, kv_head, m_tile;
  int t_begin, t_end;
  int partial_split;        // uniform splits: this split's index when num_splits > 1, else -1
  long long partial_slot;   // stream-K: the slot of a cut item's piece, else -1
};

// The stream-K cut record (verify_attention_layout.h, which the host sizes the workspace by).
typedef kdtree_cut_item CutItem;

// The segments of a CTA, walked by thread 0 into shared memory so that the walk
// holds no registers through the tile loop: the CTA's grid point with uniform
// splits, or its range of the stream-K unit line.
struct SegmentWalk {
  long long u, u_end, unit;  // stream-K: the next unit, the range's end, request b's first unit
  long long chunk;           // stream-K: units per CTA
  int b;                     // stream-K: the request holding unit u
  int done;                  // no segment left
  Segment seg;               // the current segment
  // Stream-K: the item this CTA's range starts inside, if its boundary is the
  // first to cut that item (cut_b its request, else -1), for walk_end.
  int cut_b;
  long long cut_item, cut_unit;
};

// Thread 0, after the CTA's segments: the CutItem record of the boundary at this
// CTA's start (written after the tile loops, where its work holds no registers).
static __device__ __forceinline__ void walk_end(const kdtree_verify_params& p, const SegmentWalk& w) {
  if (p.stream_ctas <= 1) return;  // uniform splits, or one CTA: nothing is cut (and no workspace)
  CutItem cut;
  cut.merge = w.cut_b >= 0;
  if (cut.merge) {
    const Request req = load_request(p, w.cut_b);
    const StreamRequest sr = stream_request(p, w.cut_b);
    cut.u0 = w.cut_unit;
    cut.chunk = w.chunk;
    cut.c0 = (int)(w.cut_unit / w.chunk);
    cut.pieces = (int)((w.cut_unit + sr.tiles - 1) / w.chunk) - cut.c0 + 1;
    cut.node_base = req.node_base;
    cut.rows_total = req.n_nodes * p.group;
    cut.out_head0 = (int)(w.cut_item / sr.m_tiles) * p.group;
    cut.m_tile = (int)(w.cut_item % sr.m_tiles);
  }
  ((CutItem*)p.cut_items)[blockIdx.x] = cut;
}

// Uniform splits (stream_ctas 0): the CTA's one segment, its grid point (x the row
// tile, y the request x KV head, z the split).
static __device__ __forceinline__ Segment grid_segment(const kdtree_verify_params& p) {
  Segment sg;
  sg.b = blockIdx.y / p.num_kv_heads;
  sg.kv_head = blockIdx.y % p.num_kv_heads;
  sg.m_tile = blockIdx.x;
  sg.t_begin = blockIdx.z * p.split_tokens;
  sg.t_end = sg.t_begin + p.split_tokens;
  sg.partial_split = p.num_splits > 1 ? (int)blockIdx.z : -1;
  sg.partial_slot = -1;
  return sg;
}

// Thread 0: the CTA's first segment (first) or its next one, into w.seg (or w.done).
static __device__ __forceinline__ void walk_next(const kdtree_verify_params& p, SegmentWalk& w, bool first) {
  Segment& sg = w.seg;
  if (p.stream_ctas == 0) {
    w.done = !first;
    sg = grid_segment(p);
    return;
  }
  w.done = w.u >= w.u_end;
  if (w.done) {
    if (first) w.cut_b = -1;  // nothing here: no boundary to merge
    return;
  }
  StreamRequest sr = stream_request(p, w.b);
  while (w.u >= w.unit + sr.units() * p.num_kv_heads) {  // the next request holds u
    w.unit += sr.units() * p.num_kv_heads;
    sr = stream_request(p, ++w.b);
  }
  const long long item = (w.u - w.unit) / sr.tiles, item_unit = w.unit + item * sr.tiles;
  const long long seg_end = min(w.u_end, item_unit + sr.tiles);
  if (first) {  // the item at this CTA's start, for its boundary's CutItem record (walk_end)
    w.cut_b = w.u != item_unit && ((long long)blockIdx.x - 1) * w.chunk <= item_unit ? w.b : -1;
    w.cut_item = item;
    w.cut_unit = item_unit;
  }
  sg.b = w.b;
  sg.kv_head = (int)(item / sr.m_tiles);
  sg.m_tile = (int)(item % sr.m_tiles);
  sg.t_begin = (int)(w.u - item_unit) * BLOCK_N;
  sg.t_end = (int)(seg_end - item_unit) * BLOCK_N;
  sg.partial_split = -1;
  const bool whole = w.u == item_unit && seg_end == item_unit + sr.tiles;
  sg.partial_slot = whole ? -1 : stream_slot(blockIdx.x, w.chunk, item_unit);
  w.u = seg_end;
}

// Starts the walk (all threads; the stream-K scan uses `scan`, THREADS + 2 words).
static __device__ __forceinline__ void walk_begin(const kdtree_verify_params& p, SegmentWalk& w, long long* scan) {
  if (p.stream_ctas > 0) {
    long long u, unit;
    int b;
    const long long total = stream_scan(p, scan, u, b, unit);
    if (threadIdx.x == 0) {
      w.chunk = stream_chunk(p, total);
      w.u = u;
      w.u_end = min(total, u + w.chunk);
      w.unit = unit;
      w.b = b;
    }
  }
}

// The segment's output target (split and stream-K slot), read again from the walk
// after the tile loop: volatile, so it holds no registers through the loop.
static __device__ __forceinline__ Segment segment_target(const SegmentWalk& walk) {
  Segment target = {};
  target.partial_split = ((volatile const Segment&)walk.seg).partial_split;
  target.partial_slot = ((volatile const Segment&)walk.seg).partial_slot;
  return target;
}

// After a segment's copies: whether any thread of the CTA met a page id outside the
// cache (its rows are then poisoned with NaN), flagged as PAGE_INDEX.
static __device__ __forceinline__ bool bad_page_seen(const kdtree_verify_params& p, bool bad_page) {
  const bool seen = __syncthreads_or(bad_page);
  if (bad_page && p.error_flags) atomicOr(p.error_flags, KDTREE_DEVICE_ERROR_PAGE_INDEX);
  return seen;
}

// The partial row (index into partial_lse; times HEAD_DIM_V into partial_o) of
// row r of a segment's row tile, output row orow.
static __device__ __forceinline__ long long partial_row(const kdtree_verify_params& p, const Segment& sg, int r,
                                                        long long orow) {
  return sg.partial_slot >= 0 ? sg.partial_slot * BLOCK_M + r
                              : (long long)sg.partial_split * p.total_nodes * p.num_q_heads + orow;
}

// ---- Splits merged in a thread-block cluster (the kdtree_verify_attention_cluster
// entries; p.cluster_splits > 1): the uniform splits of a row tile run as one
// cluster along z and merge through shared memory instead of partials in global
// memory and the combine kernel. Each split stashes its rows in its own shared
// memory as a split partial would be (normalised by its own sums, v_scale applied,
// out's 16-bit type, CLUSTER_ROW elements a row) and a log2-domain LSE per row at
// CLUSTER_LSE; after a cluster barrier, split k merges rows k, k + S, ... of the
// tile from every split's stash (cluster_merge) and writes them; a second barrier
// keeps each CTA's shared memory until every split has read it. The CTAs of a
// cluster share the request and the row tile, so they take the same early exits; a
// split past the request's kv_len stashes LSE -inf (cluster_stash_nothing) and
// still merges its rows.
constexpr int CLUSTER_MAX_SPLITS = KDTREE_MAX_CLUSTER_SPLITS;  // the CTAs of a cluster, at most
constexpr int CLUSTER_ROW = HEAD_DIM_V + 8;                     // elements a stashed row: 16 bytes of padding
                                                                // rotate the rows' banks for the stores
constexpr int CLUSTER_LSE = BLOCK_M * CLUSTER_ROW * 2;          // byte offset of the rows' LSEs in the stash
constexpr int CLUSTER_STASH_BYTES = CLUSTER_LSE + BLOCK_M * 4;
constexpr int CLUSTER_COLS = 8;                                 // columns a thread merges (16-byte loads)
constexpr int CLUSTER_ROW_THREADS = HEAD_DIM_V / CLUSTER_COLS;
static_assert(THREADS % CLUSTER_ROW_THREADS == 0, "whole rows per pass of the merge");

// The LSE merge of one row's splits, as the split combine merges partials
// (kdtree_verify_combine): split k weighs exp2(lse2[k] - the largest), a split that
// saw nothing (LSE -inf) weighs 0, and a NaN LSE (a poisoned split) makes the row
// NaN. Gives each split's weight w[k], the factor of the weighted sum (1 / the
// weights' sum; NaN for a poisoned row or one with nothing visible) and the row's
// natural-log LSE.
template <int N>
static __device__ __forceinline__ void lse_merge(const float (&lse2)[N], float (&w)[N], float& inv, float& lse) {
  bool nan = false;
  float m = -KD_INF;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    nan |= lse2[k] != lse2[k];
    m = fmaxf(m, lse2[k]);
  }
  const float m_use = m == -KD_INF ? 0.f : m;
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    w[k] = lse2[k] > -KD_INF ? kd_exp2(lse2[k] - m_use) : 0.f;
    wsum += w[k];
  }
  inv = nan ? KD_NAN : (wsum > 0.f ? 1.f / wsum : KD_NAN);
  lse = nan ? KD_NAN : (m_use + kd_log2(wsum)) * 0.69314718055994531f;
}

static __device__ __forceinline__ void cluster_stash_nothing(unsigned char* stash) {
  float* lse = (float*)(stash + CLUSTER_LSE);
  for (int r = threadIdx.x; r < BLOCK_M; r += THREADS) lse[r] = -KD_INF;
}

// stash: this CTA's stash (generic address of its shared memory); every CTA of the
// cluster keeps its own at the same offset.
static __device__ __forceinline__ void cluster_merge(const kdtree_verify_params& p, const Request& req, int row0,
                                                     int rows_total, int out_head0, const unsigned char* stash) {
  kd_cluster_sync();  // every split's rows are stashed
  const int splits = p.cluster_splits;
  const kd_u32 base = kd_smem_addr(stash);
  const int c = (threadIdx.x % CLUSTER_ROW_THREADS) * CLUSTER_COLS;
  for (int r = (int)kd_cluster_rank() + splits * (threadIdx.x / CLUSTER_ROW_THREADS); r < BLOCK_M;
       r += splits * (THREADS / CLUSTER_ROW_THREADS)) {
    if (row0 + r >= rows_total) break;
    // Every split's LSE and values first (one round trip), then the merge by LSE.
    float lse2[CLUSTER_MAX_SPLITS];
    uint4 v[CLUSTER_MAX_SPLITS];
#pragma unroll
    for (int k = 0; k < CLUSTER_MAX_SPLITS; ++k) {
      lse2[k] = -KD_INF;
      v[k] = make_uint4(0u, 0u, 0u, 0u);
      if (k < splits) {
        const kd_u32 at = kd_cluster_map(base, k);
        lse2[k] = kd_ld_cluster_f32(at + CLUSTER_LSE + r * 4);
        v[k] = kd_ld_cluster_v4(at + (r * CLUSTER_ROW + c) * 2);
      }
    }
    float w[CLUSTER_MAX_SPLITS], inv, lse;
    lse_merge(lse2, w, inv, lse);
    float acc[CLUSTER_COLS] = {};
#pragma unroll
    for (int k = 0; k < CLUSTER_MAX_SPLITS; ++k) {
      if (w[k] == 0.f) continue;  // past the cluster, nothing visible, or NaN (the row is NaN): not read
      const kd_u32 words[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 x = kd_unpack2<IS_BF16>(words[i]);
        acc[2 * i] += w[k] * x.x;
        acc[2 * i + 1] += w[k] * x.y;
      }
    }
    const long long orow = out_row(p, req.node_base, row0 + r, out_head0);
    kd_u32* out = (kd_u32*)((kd_u16*)p.out + orow * HEAD_DIM_V + c);  // out is 8-byte aligned (the C ABI)
#pragma unroll
    for (int i = 0; i < CLUSTER_COLS / 2; ++i) out[i] = kd_pack2<IS_BF16>(acc[2 * i] * inv, acc[2 * i + 1] * inv);
    if (p.lse && c == 0) p.lse[orow] = lse;
  }
  kd_cluster_sync();  // every split has read this CTA's shared memory
}

#endif  // KDTREE_VERIFY_ATTENTION_COMMON_CUH
