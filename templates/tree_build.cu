// tree_build (DDTree): best-first selection of the `budget` highest-scoring
// nodes of the candidate tree that a drafter's per-depth top-K spans.
//
// One warp per request. The frontier lives in registers: slot s belongs to lane
// s % 32, register s / 32. Each pop is a warp-wide argmax in the exact order of
// the CPU reference: score descending (as an order-preserving uint32, so one
// redux.sync compares it), then smaller depth, then the lexicographically
// smaller rank path. The last two are only consulted on exact score ties.
// Accepted-node state (parent, depth, rank, score) lives in shared memory; the
// per-node outputs are written in parallel at the end.

#include "common.cuh"
#include "tree_build_params.h"
#include "tree_build_config.h"

constexpr int MAX_TREE_NODES = KD_MAX_TREE_NODES;  // W
constexpr int SLOTS_PER_LANE = KD_SLOTS_PER_LANE;  // frontier registers per lane: ceil(W / 32)
constexpr int MASK_WORDS = KD_MASK_WORDS;          // ceil(W / 64)
constexpr int MAX_DEPTH = KD_MAX_DEPTH;
constexpr int MAX_TOP_K = KD_MAX_TOP_K;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr unsigned INVALID_SLOT = 0xffffffffu;     // an empty frontier slot

// Node / frontier entry, packed: parent output index (7 bits), depth (5),
// rank (6), and `prev` (7): the output index of the previous sibling, which
// pushed this entry (ranks > 0 only; siblings are popped in rank order).
static __device__ __forceinline__ unsigned tb_pack(int parent, int depth, int rank, int prev) {
  return unsigned(parent) | (unsigned(depth) << 7) | (unsigned(rank) << 12) | (unsigned(prev) << 18);
}
static __device__ __forceinline__ int tb_parent(unsigned info) { return int(info & 127u); }
static __device__ __forceinline__ int tb_depth(unsigned info) { return int((info >> 7) & 31u); }
static __device__ __forceinline__ int tb_rank(unsigned info) { return int((info >> 12) & 63u); }
static __device__ __forceinline__ int tb_prev(unsigned info) { return int((info >> 18) & 127u); }

// Order-preserving map float -> uint32 (larger float, larger key).
static __device__ __forceinline__ unsigned tb_order_key(float score) {
  unsigned u = __float_as_uint(score);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float tb_key_score(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// a before b for two distinct entries of equal depth: the lexicographically
// smaller rank path. Walk both up until their parents coincide; the ranks seen
// last are those at the first differing depth.
static __device__ __forceinline__ bool tb_path_less(unsigned a, unsigned b, const unsigned* s_info) {
  int pa = tb_parent(a), pb = tb_parent(b);
  int ra = tb_rank(a), rb = tb_rank(b);
  while (pa != pb) {
    const unsigned ia = s_info[pa], ib = s_info[pb];
    ra = tb_rank(ia);
    rb = tb_rank(ib);
    pa = tb_parent(ia);
    pb = tb_parent(ib);
  }
  return ra < rb;
}

static __device__ __forceinline__ bool tb_before(unsigned ka, unsigned ia, unsigned kb, unsigned ib,
                                                 const unsigned* s_info) {
  if (ka != kb) return ka > kb;
  const int da = tb_depth(ia), db = tb_depth(ib);
  if (da != db) return da < db;
  return tb_path_less(ia, ib, s_info);
}

extern "C" __global__ void __launch_bounds__(32) kdtree_tree_build(kdtree_tree_build_params p) {
  __shared__ float s_logprob[MAX_DEPTH * MAX_TOP_K];  // this request's [D, K]
  __shared__ unsigned s_info[MAX_TREE_NODES];                    // emitted nodes, packed
  __shared__ float s_score[MAX_TREE_NODES];
  __shared__ int s_first_child[MAX_TREE_NODES];
  __shared__ int s_next_sibling[MAX_TREE_NODES];

  const int b = blockIdx.x;
  const int lane = threadIdx.x;
  const int D = p.depth;
  const int K = p.top_k;
  const int budget = p.budget < MAX_TREE_NODES - 1 ? p.budget : MAX_TREE_NODES - 1;  // the frontier holds <= W entries

  const int root_token = p.root_tokens[b];
  const int prefix_len = p.prefix_lens[b];
  const float* logprob = p.draft_logprobs + (unsigned long long)b * D * K;
#pragma unroll 4
  for (int idx = lane; idx < D * K; idx += 32) s_logprob[idx] = logprob[idx];
  if (lane == 0) {
    s_info[0] = tb_pack(0, 0, 0, 0);
    s_score[0] = 0.0f;
  }
  __syncwarp();

  unsigned key[SLOTS_PER_LANE];
  unsigned info[SLOTS_PER_LANE];
#pragma unroll
  for (int j = 0; j < SLOTS_PER_LANE; ++j) {
    key[j] = 0u;
    info[j] = INVALID_SLOT;
  }
  if (lane == 0) {  // the root's first child: depth 1, rank 0
    key[0] = tb_order_key(__fadd_rn(0.0f, s_logprob[0]));
    info[0] = tb_pack(0, 1, 0, 0);
  }
  int frontier = 1;   // live entries (warp-uniform)
  int next_free = 1;  // slots are handed out once: at most 1 + budget <= W of them

  int pops = 0;
  for (; pops < budget && frontier > 0; ++pops) {
    // This lane's best entry.
    unsigned best_key = 0u, best_info = INVALID_SLOT;
    int best_slot = 0;
#pragma unroll
    for (int j = 0; j < SLOTS_PER_LANE; ++j) {
      if (info[j] != INVALID_SLOT &&
          (best_info == INVALID_SLOT || tb_before(key[j], info[j], best_key, best_info, s_info))) {
        best_key = key[j];
        best_info = info[j];
        best_slot = j;
      }
    }
    // Warp argmax: score first; depth and path only among exact score ties.
    const bool valid = best_info != INVALID_SLOT;
    const unsigned top = __reduce_max_sync(FULL_MASK, valid ? best_key : 0u);
    const bool cand = valid && best_key == top;
    unsigned winners = __ballot_sync(FULL_MASK, cand);
    if (__popc(winners) > 1) {
      const unsigned min_depth = __reduce_min_sync(FULL_MASK, cand ? unsigned(tb_depth(best_info)) : 0xffffffffu);
      winners = __ballot_sync(FULL_MASK, cand && unsigned(tb_depth(best_info)) == min_depth);
      if (__popc(winners) > 1) {
        int w = __ffs(winners) - 1;
        unsigned w_info = __shfl_sync(FULL_MASK, best_info, w);
        unsigned rest = winners & (winners - 1);
        while (rest) {
          const int l = __ffs(rest) - 1;
          rest &= rest - 1;
          const unsigned l_info = __shfl_sync(FULL_MASK, best_info, l);
          if (tb_path_less(l_info, w_info, s_info)) {
            w = l;
            w_info = l_info;
          }
        }
        winners = 1u << w;
      }
    }
    const int win_lane = __ffs(winners) - 1;
    const unsigned win = __shfl_sync(FULL_MASK, best_info, win_lane);
    const float score = tb_key_score(top);
    const int node = pops + 1;
    const int d = tb_depth(win);
    const int r = tb_rank(win);
    const int parent = tb_parent(win);
    if (lane == 0) {
      s_info[node] = win;
      s_score[node] = score;
    }
    // Expansion: the next sibling and the first child.
    const bool has_sibling = r + 1 < K;
    const bool has_child = d < D;
    const unsigned sib_key =
        has_sibling ? tb_order_key(__fadd_rn(s_score[parent], s_logprob[(d - 1) * K + r + 1])) : 0u;
    const unsigned sib_info = tb_pack(parent, d, r + 1, node);
    const unsigned child_key = has_child ? tb_order_key(__fadd_rn(score, s_logprob[d * K])) : 0u;
    const unsigned child_info = tb_pack(node, d + 1, 0, 0);
    // Selects, not indexed stores, keep the frontier in registers.
    const unsigned first_key = has_sibling ? sib_key : child_key;
    const unsigned first_info = has_sibling ? sib_info : (has_child ? child_info : INVALID_SLOT);
    const int extra = has_sibling && has_child ? next_free++ : -1;
#pragma unroll
    for (int j = 0; j < SLOTS_PER_LANE; ++j) {
      const bool replace = lane == win_lane && j == best_slot;
      const bool append = extra >= 0 && lane == (extra & 31) && j == (extra >> 5);
      key[j] = replace ? first_key : (append ? child_key : key[j]);
      info[j] = replace ? first_info : (append ? child_info : info[j]);
    }
    frontier += int(has_sibling) + int(has_child) - 1;
    __syncwarp();  // s_info / s_score of this node are read by later pops
  }
  const int count = pops + 1;

  // Links: a rank-0 node is its parent's first child; any other node is the
  // next sibling of the node that pushed it.
  for (int i = lane; i < MAX_TREE_NODES; i += 32) {
    s_first_child[i] = -1;
    s_next_sibling[i] = -1;
  }
  __syncwarp();
  for (int i = 1 + lane; i < count; i += 32) {
    const unsigned in = s_info[i];
    if (tb_rank(in) == 0) {
      s_first_child[tb_parent(in)] = i;
    } else {
      s_next_sibling[tb_prev(in)] = i;
    }
  }
  __syncwarp();

  if (lane == 0) p.node_counts[b] = count;
  const float neg_inf = __int_as_float(0xff800000);
  for (int i = lane; i < MAX_TREE_NODES; i += 32) {
    const unsigned long long row = (unsigned long long)b * MAX_TREE_NODES + i;
    unsigned long long mask[MASK_WORDS];
#pragma unroll
    for (int w = 0; w < MASK_WORDS; ++w) mask[w] = 0ull;
    if (i < count) {
      const unsigned in = s_info[i];
      const int d = i == 0 ? 0 : tb_depth(in);
      int j = i;
      while (true) {  // self and ancestors: depth <= 16 steps
#pragma unroll
        for (int w = 0; w < MASK_WORDS; ++w) mask[w] |= (j >> 6) == w ? 1ull << (j & 63) : 0ull;
        if (j == 0) break;
        j = tb_parent(s_info[j]);
      }
      p.tokens[row] = i == 0 ? root_token
                             : p.draft_tokens[((unsigned long long)b * D + (d - 1)) * K + tb_rank(in)];
      p.parents[row] = i == 0 ? -1 : tb_parent(in);
      p.depths[row] = d;
      p.positions[row] = prefix_len + d;
      p.first_child[row] = s_first_child[i];
      p.next_sibling[row] = s_next_sibling[i];
      if (p.scores) p.scores[row] = s_score[i];
    } else {
      p.tokens[row] = -1;
      p.parents[row] = -1;
      p.depths[row] = -1;
      p.positions[row] = -1;
      p.first_child[row] = -1;
      p.next_sibling[row] = -1;
      if (p.scores) p.scores[row] = neg_inf;
    }
#pragma unroll
    for (int w = 0; w < MASK_WORDS; ++w) p.tree_mask[row * MASK_WORDS + w] = mask[w];
  }
}
