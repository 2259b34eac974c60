// kv_compact: after acceptance, path entry j (tree node n_j) of request b moves
// from logical KV position prefix + n_j to prefix + j (prefix = kv_len - n_b), in
// every layer's K and V cache, through the page table. One CTA per (column chunk,
// request, layer); chunks of one row are disjoint bytes, so CTAs never race.
//
// In place: a destination prefix + j can be the source of an earlier entry i < j
// (n_i == j), never of a later one (n_k >= k > j). So entries go in groups in
// path order, each group read completely before any of its rows is written; a
// later group's sources lie past every destination written before it.
// Malformed requests set error_flags bits and are skipped (left untouched).

#include "common.cuh"
#include "kv_compact_params.h"
#include "kv_compact_config.h"

constexpr int PAGE_SIZE = KD_PAGE_SIZE;
constexpr int MAX_TREE_NODES = KD_MAX_TREE_NODES;
constexpr int THREADS = KD_THREADS;
constexpr int CHUNK_VECS = KD_CHUNK_VECS;
constexpr int VECS_PER_THREAD = KD_VECS_PER_THREAD;
// Path entries per read-then-write round.
constexpr int GROUP = THREADS * VECS_PER_THREAD / CHUNK_VECS;
// Logical pages the moved rows can span: positions [prefix + 1, prefix + n_b).
constexpr int MAX_SPAN_PAGES = (MAX_TREE_NODES + PAGE_SIZE - 2) / PAGE_SIZE + 1;

static_assert(THREADS >= MAX_TREE_NODES, "one thread per path entry");
static_assert(THREADS >= MAX_SPAN_PAGES, "one thread per touched page");
static_assert((THREADS * VECS_PER_THREAD) % CHUNK_VECS == 0, "whole rows per round");

struct alignas(16) kvc_vec {
  unsigned int x, y, z, w;
};

// Cache pointers arrive through memory, so the compiler cannot tell they are
// global: say so, and keep the loads coherent (rows are rewritten in this kernel).
static __device__ __forceinline__ kvc_vec kvc_load(const kvc_vec* p) {
  kvc_vec v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
static __device__ __forceinline__ void kvc_store(kvc_vec* p, const kvc_vec& v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS)
kdtree_kv_compact(const kdtree_kv_compact_params p) {
  __shared__ int s_path[MAX_TREE_NODES];
  __shared__ int s_page[MAX_SPAN_PAGES];
  const int b = blockIdx.y, layer = blockIdx.z, tid = threadIdx.x;

  // Per-request checks: every CTA of request b reaches the same verdict.
  const int n = p.node_counts[b];
  const int kv_len = p.kv_lens[b];
  const int accept = p.accept_lens[b];
  int error = 0;
  if (n < 1 || n > MAX_TREE_NODES || kv_len < n) {
    error = KDTREE_DEVICE_ERROR_NODE_COUNT;
  } else if ((long long)kv_len > (long long)p.max_pages_per_req * PAGE_SIZE) {
    error = KDTREE_DEVICE_ERROR_KV_LEN;
  } else if (accept < 0 || accept > n - 1) {
    error = KDTREE_DEVICE_ERROR_PATH;
  }
  const int prefix = kv_len - n;
  int first = 0;  // entries [0, first) sit in place (n_j == j); the rest move
  int page0 = 0;  // first logical page touched
  if (error == 0) {
    const int* path = p.accepted_path + (long long)b * MAX_TREE_NODES;
    bool bad = false, in_place = false;
    if (tid <= accept) {
      const int node = path[tid];
      s_path[tid] = node;
      bad = tid == 0 ? node != 0 : (node <= path[tid - 1] || node >= n);
      in_place = node == tid;
    }
    if (__syncthreads_or(bad)) {
      error = KDTREE_DEVICE_ERROR_PATH;
    } else {
      // In place entries form a prefix of a valid path (n_j >= j, strictly increasing).
      first = __syncthreads_count(in_place);
      if (first <= accept) {
        page0 = (prefix + first) / PAGE_SIZE;
        const int page_last = (prefix + s_path[accept]) / PAGE_SIZE;
        bool bad_page = false;
        if (page0 + tid <= page_last) {
          const int page = p.page_table[(long long)b * p.max_pages_per_req + page0 + tid];
          s_page[tid] = page;
          bad_page = page < 0 || page >= p.num_pages;
        }
        if (__syncthreads_or(bad_page)) error = KDTREE_DEVICE_ERROR_PAGE_INDEX;
      }
    }
  }
  if (error != 0) {
    if (p.error_flags && blockIdx.x == 0 && layer == 0 && tid == 0) atomicOr(p.error_flags, error);
    return;
  }

  const bool is_v = (int)blockIdx.x >= p.chunks_k;
  const int row_vecs = is_v ? p.row_vecs_v : p.row_vecs_k;
  const int col0 = ((int)blockIdx.x - (is_v ? p.chunks_k : 0)) * CHUNK_VECS;
  const int cols = row_vecs - col0 < CHUNK_VECS ? row_vecs - col0 : CHUNK_VECS;
  kvc_vec* cache = (kvc_vec*)(is_v ? p.v_caches : p.k_caches)[layer];

  for (int g0 = first; g0 <= accept; g0 += GROUP) {
    kvc_vec r[VECS_PER_THREAD];
#pragma unroll
    for (int u = 0; u < VECS_PER_THREAD; ++u) {
      const int slot = tid + u * THREADS;
      const int j = g0 + slot / CHUNK_VECS, c = slot % CHUNK_VECS;
      if (j <= accept && c < cols) {
        const int pos = prefix + s_path[j];
        const long long row = (long long)s_page[pos / PAGE_SIZE - page0] * PAGE_SIZE + pos % PAGE_SIZE;
        r[u] = kvc_load(cache + row * row_vecs + col0 + c);
      }
    }
    __syncthreads();  // the whole group is read before any of it is written
#pragma unroll
    for (int u = 0; u < VECS_PER_THREAD; ++u) {
      const int slot = tid + u * THREADS;
      const int j = g0 + slot / CHUNK_VECS, c = slot % CHUNK_VECS;
      if (j <= accept && c < cols) {
        const int pos = prefix + j;
        const long long row = (long long)s_page[pos / PAGE_SIZE - page0] * PAGE_SIZE + pos % PAGE_SIZE;
        kvc_store(cache + row * row_vecs + col0 + c, r[u]);
      }
    }
  }
}
