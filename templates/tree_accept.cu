// tree_accept: the longest path from the root along which every node's token
// equals the target's token at its parent (lowest node index among matching
// siblings), the accepted length and the bonus token.
//
// One warp per request, no walk: node i is "chosen" when it is the lowest-index
// child of its parent whose token matches the parent's target; it is accepted
// when every node on its ancestor chain is chosen. Pointer jumping over the
// parents (log2 of the depth rounds) gives that and each node's depth at once;
// accepted nodes form exactly the path and write path[depth] = i.

constexpr int kW = ${MAX_TREE_NODES};      // max_tree_nodes
constexpr int kPerLane = ${NODES_PER_LANE}; // ceil(W / 32)
constexpr int kErrorNodeCount = ${ERROR_NODE_COUNT};
constexpr int kErrorTree = ${ERROR_TREE};
constexpr unsigned kFull = 0xffffffffu;

extern "C" __global__ void __launch_bounds__(32) kdtree_tree_accept(kdtree_tree_accept_params p) {
  __shared__ int s_target[kW];
  __shared__ int s_chosen[kW];  // per parent: lowest matching child (kW = none)
  __shared__ int s_anc[kW];
  __shared__ int s_ok[kW];
  __shared__ int s_dep[kW];
  __shared__ int s_path[kW];

  const int b = blockIdx.x;
  const int lane = threadIdx.x;
  const unsigned long long base = (unsigned long long)b * kW;
  const int n = p.node_counts[b];

  // Device-side validation; every lane reaches the same verdict.
  int error = 0;
  long long target_base = (long long)base;
  if (n < 1 || n > kW) {
    error = kErrorNodeCount;
  } else if (p.node_indptr) {
    // The segment must lie inside the packed targets [0, total_nodes): the host
    // cannot see node_indptr, so this is the only bound on target_tokens reads.
    const long long begin = p.node_indptr[b], end = p.node_indptr[b + 1];
    if (begin < 0 || end - begin != n || end > p.total_nodes) error = kErrorNodeCount;
    target_base = begin;
  }
  int parent[kPerLane];
  int token[kPerLane];
  if (!error) {
    bool bad = false;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
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
    if (__any_sync(kFull, bad)) error = kErrorTree;
  }
  if (error) {
    if (lane == 0) {
      if (p.error_flags) atomicOr(p.error_flags, error);
      p.accept_lens[b] = -1;
      p.bonus_tokens[b] = -1;
    }
    for (int i = lane; i < kW; i += 32) p.accepted_path[base + i] = -1;
    return;
  }

  for (int i = lane; i < kW; i += 32) {
    s_chosen[i] = kW;
    s_path[i] = -1;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i >= 1 && i < n && token[j] == s_target[parent[j]]) atomicMin(&s_chosen[parent[j]], i);
  }
  __syncwarp();

  // Pointer jumping: ok &= ok(anc), dep += dep(anc), anc = anc(anc).
  int anc[kPerLane], ok[kPerLane], dep[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    anc[j] = i < n ? parent[j] : -1;
    ok[j] = i == 0 || (i < n && s_chosen[parent[j]] == i);
    dep[j] = (i >= 1 && i < n) ? 1 : 0;
    if (i < kW) {
      s_anc[i] = anc[j];
      s_ok[i] = ok[j];
      s_dep[i] = dep[j];
    }
  }
  __syncwarp();
  bool pending = false;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) pending = pending || anc[j] >= 0;
  while (__any_sync(kFull, pending)) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
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
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < kW) {
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
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < n && ok[j]) {
      s_path[dep[j]] = i;
      ++accepted;
    }
  }
  const int length = int(__reduce_add_sync(kFull, unsigned(accepted)));
  __syncwarp();
  for (int i = lane; i < kW; i += 32) p.accepted_path[base + i] = s_path[i];
  if (lane == 0) {
    p.accept_lens[b] = length - 1;
    p.bonus_tokens[b] = s_target[s_path[length - 1]];
  }
}
