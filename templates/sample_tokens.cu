// sample_tokens: one token per logits row, greedy (argmax, lowest index wins
// ties) or sampled from softmax(logits / T) with the Gumbel-max trick:
// token = argmax(logit / T + g), g = -log(-log(u)), u from a counter-based hash of
// (seed, row offset, token), so a seed reproduces its tokens on any launch shape.
// reference/sample_tokens.cpp implements the same hash and float formula.
// One CTA per row; 16-byte vector loads; NaN logits count as -inf.

#include "common.cuh"
#include "sample_tokens_params.h"
#include "sample_tokens_config.h"

constexpr int THREADS = KD_THREADS;
constexpr int UNROLL = KD_UNROLL;
constexpr int WARPS = THREADS / 32;

#if KD_LOGITS_BF16
typedef unsigned short sample_elem_t;
#else
typedef float sample_elem_t;
#endif
constexpr int VEC_ELEMS = 16 / sizeof(sample_elem_t);  // per 16-byte load

// Upper bound of any Gumbel value drawn here (u <= 1 - 2^-24 gives g <= 16.64):
// a token whose logit / T + bound is below the best score so far cannot win, so
// the hash and the logs are skipped for it without changing the result.
constexpr float GUMBEL_BOUND = 17.0f;

struct alignas(16) sample_vec {
  unsigned int x, y, z, w;
};

static __device__ __forceinline__ sample_vec sample_load_stream(const sample_vec* p) {
  sample_vec v;
  // Logits are read once: keep them out of L1.
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

static __device__ __forceinline__ float sample_to_float(sample_elem_t v) {
#if KD_LOGITS_BF16
  return __uint_as_float((unsigned int)v << 16);
#else
  return v;
#endif
}

static __device__ __forceinline__ unsigned long long sample_mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static __device__ __forceinline__ unsigned int sample_fmix32(unsigned int h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// Gumbel noise of token `t` in the row whose key is (k0, k1).
static __device__ __forceinline__ float sample_gumbel(unsigned int k0, unsigned int k1, int t) {
  unsigned int h = sample_fmix32(sample_fmix32((unsigned int)t ^ k0) ^ k1);
  // u = (2m + 1) / 2^25 for the top 24 bits m, clamped below 1: never 0 or 1.
  float u = fminf((float)(2u * (h >> 8) + 1u) * 2.98023223876953125e-8f, 0.99999994039535522f);
  // The inner log needs full accuracy near u = 1 (where g is large); the outer
  // one only adds an absolute error of ~1e-7 to g.
  return -__logf(-logf(u));
}

struct sample_best {
  float score;
  int index;
};

// Higher score wins; equal scores go to the lower index.
static __device__ __forceinline__ void sample_take(sample_best& b, float score, int index) {
  if (score > b.score || (score == b.score && index < b.index)) {
    b.score = score;
    b.index = index;
  }
}

template <bool GREEDY>
static __device__ __forceinline__ void sample_consider(sample_best& b, float logit, int index, float inv_t,
                                                       unsigned int k0, unsigned int k1) {
  float v = logit != logit ? -__int_as_float(0x7f800000) : logit;
  if (GREEDY) {
    sample_take(b, v, index);
  } else if (__fmaf_rn(v, inv_t, GUMBEL_BOUND) >= b.score) {
    sample_take(b, __fmaf_rn(v, inv_t, sample_gumbel(k0, k1, index)), index);
  }
}

template <bool GREEDY>
static __device__ __forceinline__ void sample_consider_vec(sample_best& b, const sample_vec& v, int index,
                                                           float inv_t, unsigned int k0, unsigned int k1) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#if KD_LOGITS_BF16
    sample_consider<GREEDY>(b, __uint_as_float(w[i] << 16), index + 2 * i, inv_t, k0, k1);
    sample_consider<GREEDY>(b, __uint_as_float(w[i] & 0xFFFF0000u), index + 2 * i + 1, inv_t, k0, k1);
#else
    sample_consider<GREEDY>(b, __uint_as_float(w[i]), index + i, inv_t, k0, k1);
#endif
  }
}

template <bool GREEDY>
static __device__ __forceinline__ sample_best sample_scan_row(const sample_elem_t* row, int vocab, float inv_t,
                                                              unsigned int k0, unsigned int k1) {
  sample_best b;
  b.score = -__int_as_float(0x7f800000);
  b.index = 0x7fffffff;
  const int tid = threadIdx.x;
  // Elements before the first 16-byte boundary (the row stride need not be a
  // multiple of 16 bytes), the aligned body, then the tail.
  const unsigned long long addr = (unsigned long long)row;
  int head = (int)(((16ull - (addr & 15ull)) & 15ull) / sizeof(sample_elem_t));
  head = head < vocab ? head : vocab;
  const int nvec = (vocab - head) / VEC_ELEMS;
  const int tail = head + nvec * VEC_ELEMS;
  if (tid < head) sample_consider<GREEDY>(b, sample_to_float(row[tid]), tid, inv_t, k0, k1);
  if (tail + tid < vocab) {
    sample_consider<GREEDY>(b, sample_to_float(row[tail + tid]), tail + tid, inv_t, k0, k1);
  }
  const sample_vec* body = (const sample_vec*)(row + head);
  for (int v0 = tid; v0 < nvec; v0 += THREADS * UNROLL) {
    sample_vec r[UNROLL];
    // All loads first, so UNROLL requests per thread are in flight together.
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (v0 + u * THREADS < nvec) r[u] = sample_load_stream(body + v0 + u * THREADS);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = v0 + u * THREADS;
      if (v < nvec) sample_consider_vec<GREEDY>(b, r[u], head + v * VEC_ELEMS, inv_t, k0, k1);
    }
  }
  return b;
}

static __device__ __forceinline__ sample_best sample_warp_reduce(sample_best b) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    float s = __shfl_xor_sync(0xFFFFFFFFu, b.score, offset);
    int i = __shfl_xor_sync(0xFFFFFFFFu, b.index, offset);
    sample_take(b, s, i);
  }
  return b;
}

extern "C" __global__ void __launch_bounds__(THREADS)
kdtree_sample_tokens(const kdtree_sample_tokens_params p) {
  __shared__ float s_score[WARPS];
  __shared__ int s_index[WARPS];
  const int row = blockIdx.x;
  if (row >= p.num_rows) return;
  const sample_elem_t* logits = (const sample_elem_t*)p.logits + (long long)row * p.row_stride;

  sample_best b;
  if (p.greedy) {
    b = sample_scan_row<true>(logits, p.vocab_size, 0.0f, 0u, 0u);
  } else {
    const long long offset = p.row_offsets ? p.row_offsets[row] : (long long)row;
    const unsigned long long key = sample_mix64(sample_mix64(p.seed) + (unsigned long long)offset);
    b = sample_scan_row<false>(logits, p.vocab_size, p.inv_temperature, (unsigned int)key,
                               (unsigned int)(key >> 32));
  }

  b = sample_warp_reduce(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_score[warp] = b.score;
    s_index[warp] = b.index;
  }
  __syncthreads();
  if (warp == 0) {
    b.score = lane < WARPS ? s_score[lane] : -__int_as_float(0x7f800000);
    b.index = lane < WARPS ? s_index[lane] : 0x7fffffff;
    b = sample_warp_reduce(b);
    if (lane == 0) p.out_tokens[row] = b.index == 0x7fffffff ? 0 : b.index;
  }
}
