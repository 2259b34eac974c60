// tree_allocate: the draft nodes a round verifies, allocated over the batch.
// Of the draft nodes 1..cap of every request's tree (tree_build's trees), the
// `total` of highest value, value = path log-probability + urgency x
// ln(remaining_b / the batch's most remaining) (requests not decoding after every
// decoding one); out: each request's node count, their prefix sums and the packed
// row map (request, node) of the B + total rows.
//
// The choice is kdtree.integrations.allocate.allocate's, exactly: nodes ranked
// by a stable descending sort of their keys, request after request. No sort
// here: a request's keys do not increase along its nodes (tree_build pops best
// first), so the place of node j of request b, key k, in that order is
//   j + sum over b' < b of #(keys of b' >= k) + sum over b' > b of #(keys of b' > k),
// each count a binary search of a sorted row. The place grows with j, so a
// request's count (its nodes placed before `total`) is a binary search over j.
// One CTA for the batch: a warp per request at a time, then one scan.

#include "common.cuh"
#include "tree_allocate_params.h"
#include "tree_allocate_config.h"

constexpr int W = KD_MAX_TREE_NODES;
constexpr int THREADS = KD_THREADS;
constexpr int WARPS = THREADS / 32;
constexpr int MAX_BATCH = KD_MAX_BATCH;
constexpr int PER_THREAD = (MAX_BATCH + THREADS - 1) / THREADS;  // scan entries per thread
constexpr unsigned FULL_MASK = 0xffffffffu;
// A request that is not decoding ranks after every decoding one (allocate's _DONE_OFFSET: path
// log-probabilities and log weights are > -1e4).
constexpr float DONE_OFFSET = 1.0e6f;

struct alloc_shared {
  float log_weight[MAX_BATCH];
  float offset[MAX_BATCH];   // 0, or DONE_OFFSET for a request not decoding
  int indptr[MAX_BATCH + 1];  // node counts first, then their prefix sums
  int warp_sum[WARPS];
  int max_remaining;
  int error;
};

// The key of draft node j (0-based: tree node j + 1) of request b, with allocate's float operations in its order.
static __device__ __forceinline__ float alloc_key(const kdtree_tree_allocate_params& p, const alloc_shared& s, int b,
                                                  int j) {
  return (p.scores[(long long)b * W + 1 + j] + s.log_weight[b]) - s.offset[b];
}

// #(keys of request b that are >= k) when `or_equal`, else #(> k): the row does not increase, so the count is
// the first index that fails the test.
static __device__ __forceinline__ int alloc_count_row(const kdtree_tree_allocate_params& p, const alloc_shared& s,
                                                      int b, float k, bool or_equal) {
  int lo = 0, hi = p.cap;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const float x = alloc_key(p, s, b, mid);
    if (or_equal ? x >= k : x > k) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Phase 1: each request's log weight and offset (the batch's largest remaining count first).
static __device__ void load_weights(const kdtree_tree_allocate_params& p, alloc_shared& s) {
  if (threadIdx.x == 0) {
    s.max_remaining = 1;
    s.error = 0;
  }
  __syncthreads();
  if (p.remaining) {
    int most = 1;
    for (int b = threadIdx.x; b < p.batch_size; b += THREADS) most = max(most, p.remaining[b]);
    most = int(__reduce_max_sync(FULL_MASK, unsigned(most)));  // >= 1: unsigned order is int order
    if ((threadIdx.x & 31) == 0) atomicMax(&s.max_remaining, most);
    __syncthreads();
  }
  const float most = float(s.max_remaining);
  for (int b = threadIdx.x; b < p.batch_size; b += THREADS) {
    // allocate.behind: urgency x log(max(remaining, 1) / the most), in float32
    s.log_weight[b] = p.remaining ? p.urgency * logf(fmaxf(float(p.remaining[b]), 1.0f) / most) : 0.0f;
    s.offset[b] = (p.active && !p.active[b]) ? DONE_OFFSET : 0.0f;
  }
  __syncthreads();
}

// Phase 2: the binary searches need every request's keys non-increasing and none NaN.
static __device__ bool check_keys(const kdtree_tree_allocate_params& p, const alloc_shared& s) {
  bool bad = false;
  const int n = p.batch_size * p.cap;
  for (int i = threadIdx.x; i < n; i += THREADS) {
    const int b = i / p.cap, j = i - b * p.cap;
    const float k = alloc_key(p, s, b, j);
    bad = bad || k != k || (j + 1 < p.cap && !(k >= alloc_key(p, s, b, j + 1)));
  }
  return __syncthreads_or(bad) != 0;
}

// Phase 3: request b's count (1 + its draft nodes) into s.indptr[b + 1], one warp per request.
static __device__ void count_nodes(const kdtree_tree_allocate_params& p, alloc_shared& s) {
  const int lane = threadIdx.x & 31;
  for (int b = threadIdx.x >> 5; b < p.batch_size; b += WARPS) {
    int lo = 0, hi = p.cap;  // the first j whose place is >= total
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      const float k = alloc_key(p, s, b, mid);
      int before = 0;
      for (int o = lane; o < p.batch_size; o += 32) {
        if (o != b) before += alloc_count_row(p, s, o, k, o < b);
      }
      const long long place = (long long)mid + __reduce_add_sync(FULL_MASK, unsigned(before));
      if (place < p.total) lo = mid + 1;
      else hi = mid;
    }
    if (lane == 0) s.indptr[b + 1] = lo + 1;
  }
  __syncthreads();
}

// Phase 4: the counts' prefix sums in place (s.indptr[0] = 0); PER_THREAD consecutive entries per thread.
static __device__ void scan_counts(const kdtree_tree_allocate_params& p, alloc_shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first = threadIdx.x * PER_THREAD;
  int v[PER_THREAD];
  int sum = 0;
#pragma unroll
  for (int e = 0; e < PER_THREAD; ++e) {
    v[e] = first + e < p.batch_size ? s.indptr[first + e + 1] : 0;
    sum += v[e];
  }
  int incl = sum;  // inclusive scan of the threads' sums within the warp
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int x = __shfl_up_sync(FULL_MASK, incl, d);
    if (lane >= d) incl += x;
  }
  if (lane == 31) s.warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < WARPS ? s.warp_sum[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int x = __shfl_up_sync(FULL_MASK, w, d);
      if (lane >= d) w += x;
    }
    if (lane < WARPS) s.warp_sum[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int run = incl - sum + (warp ? s.warp_sum[warp - 1] : 0);
#pragma unroll
  for (int e = 0; e < PER_THREAD; ++e) {
    run += v[e];
    if (first + e < p.batch_size) s.indptr[first + e + 1] = run;
  }
  if (threadIdx.x == 0) s.indptr[0] = 0;
  __syncthreads();
}

// Phase 5: the outputs. Row r belongs to the request whose segment holds it; rows past the last segment (only
// after an error) are (0, 0).
static __device__ void write_rows(const kdtree_tree_allocate_params& p, const alloc_shared& s) {
  const int B = p.batch_size;
  for (int b = threadIdx.x; b < B; b += THREADS) {
    p.node_counts[b] = s.indptr[b + 1] - s.indptr[b];
    p.node_indptr[b] = s.indptr[b];
  }
  if (threadIdx.x == 0) p.node_indptr[B] = s.indptr[B];
  const int rows = B + p.total;
  for (int r = threadIdx.x; r < rows; r += THREADS) {
    long long req = 0, node = 0;
    if (r < s.indptr[B]) {
      int lo = 0, hi = B - 1;  // the last b with indptr[b] <= r
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (s.indptr[mid] <= r) lo = mid;
        else hi = mid - 1;
      }
      req = lo;
      node = r - s.indptr[lo];
    }
    p.row_req[r] = req;
    p.row_node[r] = node;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS) kdtree_tree_allocate(kdtree_tree_allocate_params p) {
  __shared__ alloc_shared s;
  load_weights(p, s);
  if (check_keys(p, s)) {
    // NaN or increasing scores: every request keeps its root only (KDTREE_DEVICE_ERROR_SCORES)
    for (int b = threadIdx.x; b < p.batch_size; b += THREADS) s.indptr[b + 1] = b + 1;
    if (threadIdx.x == 0 && p.error_flags) atomicOr(p.error_flags, KDTREE_DEVICE_ERROR_SCORES);
    if (threadIdx.x == 0) s.indptr[0] = 0;
    __syncthreads();
  } else {
    count_nodes(p, s);
    scan_counts(p, s);
  }
  write_rows(p, s);
}
