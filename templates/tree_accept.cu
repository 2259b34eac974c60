// tree_accept: the longest path from the root along which every node's token
// equals the target's token at its parent (lowest node index among matching
// siblings), the accepted length and the bonus token.
//
// One warp per request, no walk: node i is "chosen" when it is the lowest-index
// child of its parent whose token matches the parent's target; it is accepted
// when every node on its ancestor chain is chosen. Pointer jumping over the
// parents (log2 of the depth rounds) gives that and each node's depth at once;
// accepted nodes form exactly the path and write path[depth] = i.

#include "common.cuh"
#include "tree_accept_params.h"
#include "tree_accept_config.h"

constexpr int MAX_TREE_NODES = KD_MAX_TREE_NODES;  // W
constexpr int NODES_PER_LANE = KD_NODES_PER_LANE;  // ceil(W / 32)
constexpr unsigned FULL_MASK = 0xffffffffu;

extern "C" __global__ void __launch_bounds__(32) kdtree_tree_accept(kdtree_tree_accept_params p) {
  __shared__ int s_target[MAX_TREE_NODES];
  __shared__ int s_chosen[MAX_TREE_NODES];  // per parent: lowest matching child (MAX_TREE_NODES = none)
  __shared__ int s_anc[MAX_TREE_NODES];
  __shared__ int s_ok[MAX_TREE_NODES];
  __shared__ int s_dep[MAX_TREE_NODES];
  __shared__ int s_path[MAX_TREE_NODES];

  const int b = blockIdx.x;
  const int lane = threadIdx.x;
  const unsigned long long base = (unsigned long long)b * MAX_TREE_NODES;
  const int n = p.node_counts[b];

  // Device-side validation; every lane reaches the same verdict.
  int error = 0;
  long long target_base = (long long)base;
  if (n < 1 || n > MAX_TREE_NODES) {
    error = KDTREE_DEVICE_ERROR_NODE_COUNT;
  } else if (p.node_indptr) {
    // The segment must lie inside the packed targets [0, total_nodes): the host
    // cannot see node_indptr, so this is the only bound on target_tokens reads.
    const long long begin = p.node_indptr[b], end = p.node_indptr[b + 1];
    if (begin < 0 || end - begin != n || end > p.total_nodes) error = KDTREE_DEVICE_ERROR_NODE_COUNT;
    target_base = begin;
  }
  int parent[NODES_PER_LANE];
  int token[NODES_PER_LANE];
  if (!error) {
    bool bad = false;
#pragma unroll
    for (int j = 0; j < NODES_PER_LANE; ++j) {
      const int i = lane + 32 * j;
      parent[j] = -1;
      token[j] = 0;
      if (i < n) {
        parent[j] = p.parents[base + i];
        token[j] = p.tokens[base + i];
        s_target[i] = p.target_tokens[target_base + i];
        bad = bad || (i == 0 ? parent[j] != -1 : (parent[j] < 0 || parent[j] >= i));
      }
    }
    if (__any_sync(FULL_MASK, bad)) error = KDTREE_DEVICE_ERROR_TREE;
  }
  if (error) {
    if (lane == 0) {
      if (p.error_flags) atomicOr(p.error_flags, error);
      p.accept_lens[b] = -1;
      p.bonus_tokens[b] = -1;
    }
    for (int i = lane; i < MAX_TREE_NODES; i += 32) p.accepted_path[base + i] = -1;
    return;
  }

  for (int i = lane; i < MAX_TREE_NODES; i += 32) {
    s_chosen[i] = MAX_TREE_NODES;
    s_path[i] = -1;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < NODES_PER_LANE; ++j) {
    const int i = lane + 32 * j;
    if (i >= 1 && i < n && token[j] == s_target[parent[j]]) atomicMin(&s_chosen[parent[j]], i);
  }
  __syncwarp();

  // Pointer jumping: ok &= ok(anc), dep += dep(anc), anc = anc(anc).
  int anc[NODES_PER_LANE], ok[NODES_PER_LANE], dep[NODES_PER_LANE];
#pragma unroll
  for (int j = 0; j < NODES_PER_LANE; ++j) {
    const int i = lane + 32 * j;
    anc[j] = i < n ? parent[j] : -1;
    ok[j] = i == 0 || (i < n && s_chosen[parent[j]] == i);
    dep[j] = (i >= 1 && i < n) ? 1 : 0;
    if (i < MAX_TREE_NODES) {
      s_anc[i] = anc[j];
      s_ok[i] = ok[j];
      s_dep[i] = dep[j];
    }
  }
  __syncwarp();
  bool pending = false;
#pragma unroll
  for (int j = 0; j < NODES_PER_LANE; ++j) pending = pending || anc[j] >= 0;
  while (__any_sync(FULL_MASK, pending)) {
#pragma unroll
    for (int j = 0; j < NODES_PER_LANE; ++j) {
      if (anc[j] >= 0) {
        const int a = anc[j];
        ok[j] &= s_ok[a];
        dep[j] += s_dep[a];
        anc[j] = s_anc[a];
      }
    }
    __syncwarp();  // every read of this round before any write
    pending = false;
#pragma unroll
    for (int j = 0; j < NODES_PER_LANE; ++j) {
      const int i = lane + 32 * j;
      if (i < MAX_TREE_NODES) {
        s_anc[i] = anc[j];
        s_ok[i] = ok[j];
        s_dep[i] = dep[j];
      }
      pending = pending || anc[j] >= 0;
    }
    __syncwarp();
  }

  int accepted = 0;
#pragma unroll
  for (int j = 0; j < NODES_PER_LANE; ++j) {
    const int i = lane + 32 * j;
    if (i < n && ok[j]) {
      s_path[dep[j]] = i;
      ++accepted;
    }
  }
  const int length = int(__reduce_add_sync(FULL_MASK, unsigned(accepted)));
  __syncwarp();
  for (int i = lane; i < MAX_TREE_NODES; i += 32) p.accepted_path[base + i] = s_path[i];
  if (lane == 0) {
    p.accept_lens[b] = length - 1;
    p.bonus_tokens[b] = s_target[s_path[length - 1]];
  }
}
