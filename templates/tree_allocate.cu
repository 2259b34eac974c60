// tree_allocate: the draft nodes a round verifies, allocated over the batch.
// Of the draft nodes 1..cap of every request's tree (tree_build's trees), the
// `total` of highest value, value = path log-probability + urgency x
// ln(remaining_b / the batch's most remaining) (requests not decoding after every
// decoding one); out: each request's node count, their prefix sums and the packed
// row map (request, node) of the B + total rows.
//
// The choice is kdtree.integrations.allocate.allocate's, exactly: nodes ranked
// by a stable descending sort of their keys, request after request. No sort
// here: the total-th largest key T is found by a radix select over the keys'
// order-preserving 32-bit codes (four passes of 8 bits, each a shared-memory
// histogram of the keys that match the digits so far), every node above T is
// taken, and of the nodes equal to T the first ones in request order, as many as
// the select left over. A request's keys do not increase along its nodes
// (tree_build pops best first), so its count above and at T is two binary searches
// of its row, and what it takes is a prefix of its tree. One CTA for the batch:
// every pass is parallel over all keys (or requests), none a dependent chain.

#include "common.cuh"
#include "tree_allocate_params.h"
#include "tree_allocate_config.h"

constexpr int W = KD_MAX_TREE_NODES;
constexpr int THREADS = KD_THREADS;
constexpr int WARPS = THREADS / 32;
constexpr int MAX_BATCH = KD_MAX_BATCH;
constexpr int PER_THREAD = (MAX_BATCH + THREADS - 1) / THREADS;  // scan entries per thread
constexpr int BINS = 256;                                        // radix digits per pass
constexpr unsigned FULL_MASK = 0xffffffffu;
// A request that is not decoding ranks after every decoding one (allocate's _DONE_OFFSET: path
// log-probabilities and log weights are > -1e4).
constexpr float DONE_OFFSET = 1.0e6f;

struct alloc_shared {
  float log_weight[MAX_BATCH];
  float offset[MAX_BATCH];    // 0, or DONE_OFFSET for a request not decoding
  int indptr[MAX_BATCH + 1];  // per-request values, then their prefix sums (scan_requests)
  int above[MAX_BATCH];       // per request: nodes whose key is above the threshold
  int hist[BINS];
  int warp_sum[WARPS];
  unsigned prefix;  // the threshold's digits found so far
  int need;         // of the keys matching them, how many the allocation still takes
  int max_remaining;
  int error;
};

// The key of draft node j (0-based: tree node j + 1) of request b, with allocate's float operations in its order.
static __device__ __forceinline__ float alloc_key(const kdtree_tree_allocate_params& p, const alloc_shared& s, int b,
                                                  int j) {
  return (p.scores[(long long)b * W + 1 + j] + s.log_weight[b]) - s.offset[b];
}

// An order-preserving code of a (non-NaN) key: a > b as floats iff code(a) > code(b) as unsigned; -0 is 0.
static __device__ __forceinline__ unsigned alloc_code(float k) {
  const unsigned u = __float_as_uint(k == 0.0f ? 0.0f : k);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// #(keys of request b whose code is > c), or >= c when `or_equal`: the row does not increase, so the count is the
// first index that fails the test.
static __device__ __forceinline__ int alloc_count_row(const kdtree_tree_allocate_params& p, const alloc_shared& s,
                                                      int b, unsigned c, bool or_equal) {
  int lo = 0, hi = p.cap;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const unsigned x = alloc_code(alloc_key(p, s, b, mid));
    if (or_equal ? x >= c : x > c) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Phase 1: each request's log weight and offset (the batch's largest remaining count first).
static __device__ __forceinline__ void load_weights(const kdtree_tree_allocate_params& p, alloc_shared& s) {
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
static __device__ __forceinline__ bool check_keys(const kdtree_tree_allocate_params& p, const alloc_shared& s) {
  bool bad = false;
  const int n = p.batch_size * p.cap;
  for (int i = threadIdx.x; i < n; i += THREADS) {
    const int b = i / p.cap, j = i - b * p.cap;
    const float k = alloc_key(p, s, b, j);
    bad = bad || k != k || (j + 1 < p.cap && !(k >= alloc_key(p, s, b, j + 1)));
  }
  return __syncthreads_or(bad) != 0;
}

// Phase 3: the code of the total-th largest key (1 <= total <= B x cap) into s.prefix, and into s.need how many
// keys equal to it the allocation takes: a radix select, most significant digit first.
static __device__ __forceinline__ void select_threshold(const kdtree_tree_allocate_params& p, alloc_shared& s) {
  const int n = p.batch_size * p.cap;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.need = p.total;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < BINS; d += THREADS) s.hist[d] = 0;
    __syncthreads();
    const unsigned high = shift == 24 ? 0u : ~0u << (shift + 8), prefix = s.prefix;
    for (int i = threadIdx.x; i < n; i += THREADS) {
      const int b = i / p.cap;
      const unsigned c = alloc_code(alloc_key(p, s, b, i - b * p.cap));
      if ((c & high) == (prefix & high)) atomicAdd(&s.hist[(c >> shift) & (BINS - 1)], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds digits 255 - 8l .. 248 - 8l (the largest first); the digit where the count from the top
      // reaches `need` is the threshold's.
      int h[BINS / 32], sum = 0;
#pragma unroll
      for (int e = 0; e < BINS / 32; ++e) {
        h[e] = s.hist[BINS - 1 - (lane * (BINS / 32) + e)];
        sum += h[e];
      }
      int incl = sum;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int x = __shfl_up_sync(FULL_MASK, incl, d);
        if (lane >= d) incl += x;
      }
      const int need = s.need;
      const unsigned hit = __ballot_sync(FULL_MASK, incl >= need);
      const int owner = __ffs(hit) - 1;  // need <= the count of every matching key: some lane reaches it
      __syncwarp();  // every lane's read of s.need before the owner's write
      if (lane == owner) {
        int left = need - (incl - sum);
#pragma unroll
        for (int e = 0; e < BINS / 32; ++e) {
          if (left > 0 && left <= h[e]) {
            s.prefix = prefix | (unsigned(BINS - 1 - (lane * (BINS / 32) + e)) << shift);
            s.need = left;
            left = 0;
          } else if (left > 0) {
            left -= h[e];
          }
        }
      }
    }
    __syncthreads();
  }
}

// Phase 4, in place over s.indptr[1..B]: inclusive prefix sums of the per-request values there (s.indptr[0] = 0).
static __device__ __forceinline__ void scan_requests(const kdtree_tree_allocate_params& p, alloc_shared& s) {
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

// Phase 5: each request's count, 1 + its nodes above the threshold + those at it that the select left over,
// first come (request order) first served; then their prefix sums in s.indptr.
static __device__ __forceinline__ void count_nodes(const kdtree_tree_allocate_params& p, alloc_shared& s) {
  const unsigned t = s.prefix;
  for (int b = threadIdx.x; b < p.batch_size; b += THREADS) {
    const int above = alloc_count_row(p, s, b, t, false);
    s.above[b] = above;
    s.indptr[b + 1] = alloc_count_row(p, s, b, t, true) - above;  // equal to the threshold
  }
  __syncthreads();
  scan_requests(p, s);
  const int need = s.need;
  int taken[PER_THREAD];
#pragma unroll
  for (int e = 0; e < PER_THREAD; ++e) {
    const int b = threadIdx.x + e * THREADS;
    if (b < p.batch_size) {
      const int equal = s.indptr[b + 1] - s.indptr[b], before = s.indptr[b];
      taken[e] = 1 + s.above[b] + min(max(need - before, 0), equal);
    }
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < PER_THREAD; ++e) {
    const int b = threadIdx.x + e * THREADS;
    if (b < p.batch_size) s.indptr[b + 1] = taken[e];
  }
  __syncthreads();
  scan_requests(p, s);
}

// Phase 6: the outputs. Row r belongs to the request whose segment holds it; rows past the last segment (only
// after an error) are (0, 0).
static __device__ __forceinline__ void write_rows(const kdtree_tree_allocate_params& p, const alloc_shared& s) {
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

extern "C" __global__ void __launch_bounds__(THREADS, 1) kdtree_tree_allocate(kdtree_tree_allocate_params p) {
  __shared__ alloc_shared s;
  load_weights(p, s);
  const bool bad = check_keys(p, s);
  if (!bad && p.total > 0) {
    select_threshold(p, s);
    count_nodes(p, s);
  } else {
    // No draft node (total 0), or NaN or increasing scores: every request keeps its root only (the latter sets
    // KDTREE_DEVICE_ERROR_SCORES)
    for (int b = threadIdx.x; b < p.batch_size; b += THREADS) s.indptr[b + 1] = b + 1;
    if (threadIdx.x == 0) {
      s.indptr[0] = 0;
      if (bad && p.error_flags) atomicOr(p.error_flags, KDTREE_DEVICE_ERROR_SCORES);
    }
    __syncthreads();
  }
  write_rows(p, s);
}
