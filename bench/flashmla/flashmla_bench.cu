// bench_flashmla: FlashMLA's sm90 dense decode (bf16, paged, causal) on bench_verify's
// MLA shapes, so kdtree's Hopper kernels can be compared against FlashMLA built from
// source and run in the same device session (issue 17).
//
// This is our harness, not FlashMLA code: FlashMLA's torch entry point
// (csrc/api/dense_decode.h) is replaced by plain C++ that fills its DenseAttnDecodeParams,
// GetDecodeSchedMetaParams and CombineParams from cudaMalloc'd buffers, the way that entry
// point fills them from tensors, and calls FlashMLA's three launchers: scheduler metadata,
// the split-KV MLA kernel, the combine kernel. Build: bench/flashmla/build.sh.
//
// Per shape (bench/verify_shapes.hpp, the rows with head_qk 576): q is [B, n, H, 576],
// the cache [pages, 64, 1, 576] with V = its first 512 dims, every request's cache length
// prefix + n (the n verified tokens are the cache's last n, as in bench_verify), causal:
// token t of a request sees cache positions [0, len - n + t] (FlashMLA's bottom-right
// causal mask, which equals bench_verify's chain-shaped tree). Page tables are a shuffled
// permutation of the pages; q and the cache are rotated over several copies so L2 does
// not serve them (bench_verify's rule).
//
// Times (µs, medians of CUDA-event timings after warm-up):
//   us        one whole call as a fresh sched_meta makes it: metadata + MLA + combine
//             (FlashMLA's flash_mla_with_kvcache computes the metadata on the first call
//             with a new sched_meta and reuses it afterwards);
//   nometa_us MLA + combine with the metadata reused (the steady state of a sched_meta
//             shared across layers);
//   b2b_us    back-to-back whole calls, total / iters (host work overlapped);
//   graph_us / graph_nm_us  CUDA-graph replays of the whole call / of MLA + combine.
// TFLOP/s and KV_GB/s use bench_verify's counts (FLOPs = 2 * rows * kv_len * (576 + 512),
// rows = tokens x heads, the mask's savings not subtracted) over `us`.
//
// Correctness: before timing, a small problem (4 requests of different lengths, partial
// pages, split across SMs so the combine runs) is checked in full against a CPU float
// reference; then every timed shape is checked on sampled rows. A failure exits 1.
//
// usage: bench_flashmla [--json FILE] [--iters N] [--shape NAME_OR_PREFIX]
//                       [--tflops R] [--gbps B] [--no-check]
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// FlashMLA's headers (FLASHMLA_DIR/csrc): parameter structs and launcher declarations.
#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"
// Ours: the shape list bench_verify runs.
#include "verify_shapes.hpp"

#ifndef BENCH_FLASHMLA_REV
#define BENCH_FLASHMLA_REV "unknown"
#endif

namespace {

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

constexpr int kDqk = 576, kDv = 512, kPage = 64;  // the only sizes FlashMLA's dense sm90 kernel takes

uint16_t f2bf(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf2f(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<uint16_t> random_bf16(size_t n, float amp, std::mt19937_64& rng) {
  std::vector<uint16_t> v(n);
  std::uniform_real_distribution<float> u(-amp, amp);
  for (auto& x : v) x = f2bf(u(rng));
  return v;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(host.size() * sizeof(T), 16)));
  CK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
T* alloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n * sizeof(T), 16)));
  return p;
}

// One problem's device buffers and the parameter structs FlashMLA's launchers take.
struct Problem {
  int b = 0, s_q = 0, h_q = 0;
  float scale = 0;
  std::vector<int> lens;           // per request cache length
  int max_blocks = 0, num_blocks = 0, num_sm_parts = 0;
  std::vector<int32_t> table;      // [b, max_blocks]
  std::vector<uint16_t> q_host, k_host;  // copy 0, for the CPU reference
  std::vector<uint16_t*> q, k;     // rotated copies
  int *d_table = nullptr, *d_lens = nullptr, *d_num_splits = nullptr;
  DecodingSchedMeta* d_meta = nullptr;
  uint16_t* d_out = nullptr;
  float *d_lse = nullptr, *d_lse_accum = nullptr, *d_o_accum = nullptr;

  Problem(int b_, int s_q_, int h_q_, const std::vector<int>& lens_, float scale_, int copies, int num_sms,
          std::mt19937_64& rng)
      : b(b_), s_q(s_q_), h_q(h_q_), scale(scale_), lens(lens_) {
    const int max_len = *std::max_element(lens.begin(), lens.end());
    max_blocks = (max_len + kPage - 1) / kPage;
    num_blocks = 0;
    for (int len : lens) num_blocks += (len + kPage - 1) / kPage;
    // Each request's pages scattered over the physical pages; unused table slots -> page 0.
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(size_t(b) * max_blocks, 0);
    for (int r = 0, next = 0; r < b; ++r)
      for (int j = 0; j < (lens[r] + kPage - 1) / kPage; ++j) table[size_t(r) * max_blocks + j] = perm[next++];
    // FlashMLA's split over SMs (dense_decode.h): h_k = 1, 64-row m-blocks of s_q * h_q rows.
    num_sm_parts = std::max(num_sms / ((s_q * h_q + 63) / 64), 1);

    q_host = random_bf16(size_t(b) * s_q * h_q * kDqk, 1.f, rng);
    k_host = random_bf16(size_t(num_blocks) * kPage * kDqk, 1.f, rng);
    for (int c = 0; c < copies; ++c) {
      q.push_back(upload(q_host));
      k.push_back(upload(k_host));
    }
    d_table = upload(table);
    d_lens = upload(lens);
    d_meta = alloc<DecodingSchedMeta>(num_sm_parts);
    d_num_splits = alloc<int>(b + 1);
    d_out = alloc<uint16_t>(size_t(b) * s_q * h_q * kDv);
    d_lse = alloc<float>(size_t(b) * s_q * h_q);
    const size_t total_splits = size_t(b) + num_sm_parts;  // dense_decode.h's bound
    d_lse_accum = alloc<float>(total_splits * s_q * h_q);
    d_o_accum = alloc<float>(total_splits * s_q * h_q * kDv);
  }
  ~Problem() {
    for (auto* p : q) cudaFree(p);
    for (auto* p : k) cudaFree(p);
    for (void* p : {(void*)d_table, (void*)d_lens, (void*)d_num_splits, (void*)d_meta, (void*)d_out, (void*)d_lse,
                    (void*)d_lse_accum, (void*)d_o_accum})
      cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  // One flash_mla_with_kvcache call (dense, bf16, causal), as dense_attn_decode_interface
  // issues it; with_meta = false is a call with an already initialised sched_meta.
  void call(int copy, cudaStream_t stream, bool with_meta) {
    // h_k = 1: q [b, s_q, h_q, d] is FlashMLA's [b, s_q * h_q, 1, d] (row = token * h_q + head).
    const int q_seq_per_hk = s_q * h_q;
    if (with_meta) {
      GetDecodeSchedMetaParams m{};
      m.b = b;
      m.s_q = s_q;
      m.block_size_n = 64;
      m.fixed_overhead_num_blocks = 5;
      m.topk = -1;
      m.extra_topk = -1;
      m.topk_length = nullptr;
      m.extra_topk_length = nullptr;
      m.seqlens_k_ptr = d_lens;
      m.tile_scheduler_metadata_ptr = d_meta;
      m.num_splits_ptr = d_num_splits;
      m.num_sm_parts = num_sm_parts;
      m.stream = stream;
      smxx::decode::run_get_decoding_sched_meta_kernel(m);
    }
    DenseAttnDecodeParams p{};
    p.b = b;
    p.s_q = s_q;
    p.q_seq_per_hk = q_seq_per_hk;
    p.seqlens_k_ptr = d_lens;
    p.h_q = h_q;
    p.h_k = 1;
    p.num_blocks = num_blocks;
    p.q_head_per_hk = h_q;
    p.is_causal = s_q > 1;  // FlashMLA drops causal for one query token
    p.d = kDqk;
    p.d_v = kDv;
    p.scale_softmax = scale;
    p.scale_softmax_log2 = float(scale * M_LOG2E);
    p.q_ptr = q[copy];
    p.k_ptr = k[copy];
    p.o_ptr = d_out;
    p.softmax_lse_ptr = d_lse;
    // Strides in elements, as the torch views in dense_decode.h give them.
    p.q_batch_stride = int64_t(q_seq_per_hk) * kDqk;
    p.q_row_stride = kDqk;
    p.q_head_stride = kDqk;
    p.k_batch_stride = int64_t(kPage) * kDqk;
    p.k_row_stride = kDqk;
    p.k_head_stride = kDqk;
    p.o_batch_stride = int64_t(q_seq_per_hk) * kDv;  // out [b, h_k, q_seq_per_hk, d_v]
    p.o_row_stride = kDv;
    p.o_head_stride = int64_t(q_seq_per_hk) * kDv;
    p.block_table = d_table;
    p.block_table_batch_stride = max_blocks;
    p.page_block_size = kPage;
    p.tile_scheduler_metadata_ptr = d_meta;
    p.num_sm_parts = num_sm_parts;
    p.num_splits_ptr = d_num_splits;
    p.total_num_splits = b + num_sm_parts;
    p.softmax_lseaccum_ptr = d_lse_accum;
    p.oaccum_ptr = d_o_accum;
    p.stream = stream;
    sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);

    CombineParams c{};
    c.b = b;
    c.s_q = s_q;
    c.h_q = h_q;
    c.d_v = kDv;
    c.lse = d_lse;
    c.out = d_out;
    c.stride_lse_b = q_seq_per_hk;
    c.stride_lse_s_q = h_q;
    c.stride_o_b = h_q * s_q * kDv;
    c.stride_o_s_q = h_q * kDv;
    c.stride_o_h_q = kDv;
    c.lse_accum = d_lse_accum;
    c.o_accum = d_o_accum;
    c.stride_lse_accum_split = q_seq_per_hk;
    c.stride_lse_accum_s_q = h_q;
    c.stride_o_accum_split = h_q * s_q * kDv;
    c.stride_o_accum_s_q = h_q * kDv;
    c.stride_o_accum_h_q = kDv;
    c.tile_scheduler_metadata_ptr = d_meta;
    c.num_splits_ptr = d_num_splits;
    c.num_sm_parts = num_sm_parts;
    c.attn_sink = nullptr;
    c.stream = stream;
    smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
  }

  // CPU float reference for one output row (request r, token t, head h): o[512] and the
  // natural-log LSE, over the cache positions token t may see.
  void reference(int r, int t, int h, std::vector<float>& o, double& lse) const {
    const uint16_t* qrow = &q_host[((size_t(r) * s_q + t) * h_q + h) * kDqk];
    float qf[kDqk];
    for (int d = 0; d < kDqk; ++d) qf[d] = bf2f(qrow[d]);
    const int visible = lens[r] - (s_q - 1 - t);  // bottom-right causal
    std::vector<double> s(std::max(visible, 0));
    double m = -INFINITY;
    auto key = [&](int j) {
      const int page = table[size_t(r) * max_blocks + j / kPage];
      return &k_host[(size_t(page) * kPage + j % kPage) * kDqk];
    };
    for (int j = 0; j < visible; ++j) {
      const uint16_t* kr = key(j);
      double acc = 0;
      for (int d = 0; d < kDqk; ++d) acc += double(qf[d]) * bf2f(kr[d]);
      s[j] = acc * scale;
      m = std::max(m, s[j]);
    }
    std::vector<double> acc(kDv, 0.0);
    double sum = 0;
    for (int j = 0; j < visible; ++j) {
      const double p = std::exp(s[j] - m);
      sum += p;
      const uint16_t* kr = key(j);
      for (int d = 0; d < kDv; ++d) acc[d] += p * bf2f(kr[d]);
    }
    o.assign(kDv, 0.f);
    for (int d = 0; d < kDv; ++d) o[d] = float(acc[d] / sum);
    lse = m + std::log(sum);
  }

  // Compares rows (r, t, h) of the last call's output with the reference: the worst of
  // max|o - ref| / max|ref| per row, and the worst |lse - ref|. NaN anywhere fails.
  struct Err {
    double rel = 0, lse = 0;
    bool nan = false;
  };
  Err check(const std::vector<std::array<int, 3>>& rows) const {
    std::vector<uint16_t> out(size_t(b) * s_q * h_q * kDv);
    std::vector<float> lse(size_t(b) * s_q * h_q);
    CK(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost));
    Err e;
    for (uint16_t x : out) e.nan |= std::isnan(bf2f(x));
    std::vector<float> ref;
    for (const auto& row : rows) {
      const int r = row[0], t = row[1], h = row[2];
      double ref_lse = 0;
      reference(r, t, h, ref, ref_lse);
      const size_t i = (size_t(r) * s_q + t) * h_q + h;  // out [b, s_q, h_q, d_v], lse [b, s_q * h_q]
      double err = 0, mag = 0;
      for (int d = 0; d < kDv; ++d) {
        err = std::max(err, std::fabs(double(bf2f(out[i * kDv + d])) - ref[d]));
        mag = std::max(mag, std::fabs(double(ref[d])));
      }
      const double rel = mag > 0 ? err / mag : err;
      e.rel = std::max(e.rel, std::isnan(rel) ? INFINITY : rel);
      const double le = std::fabs(double(lse[i]) - ref_lse);
      e.lse = std::max(e.lse, std::isnan(le) ? INFINITY : le);
    }
    return e;
  }
};

// bf16 output: 8 mantissa bits give ~4e-3 relative rounding and P is rounded to bf16
// before PV (FlashMLA's own test allows 2/128 relative). The LSE is fp32 throughout
// (its test allows 8/65536 relative, ~1e-3 at these lengths).
constexpr double kMaxRel = 2e-2, kMaxLseErr = 2e-3;

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  const char* only = nullptr;
  int iters = 50;
  bool do_check = true;
  double tflops = 647.0, gbps = 4270.0;  // bench_verify's floor rates for the H200
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--tflops") && i + 1 < argc)
      tflops = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--gbps") && i + 1 < argc)
      gbps = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-check"))
      do_check = false;
    else {
      std::fprintf(stderr,
                   "usage: bench_flashmla [--json FILE] [--iters N] [--shape NAME_OR_PREFIX] [--tflops R] "
                   "[--gbps B] [--no-check]\n");
      return 2;
    }
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("bench_flashmla: skipped, no GPU\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "bench_flashmla: FlashMLA's dense decode kernel needs sm_90 (this GPU is sm_%d%d)\n",
                 prop.major, prop.minor);
    return 1;
  }
  const int num_sms = prop.multiProcessorCount;
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("FlashMLA %s (sm90 dense decode, bf16, causal) on %s, %d SMs, driver %d, runtime %d\n",
              BENCH_FLASHMLA_REV, prop.name, num_sms, driver, runtime);
  std::mt19937_64 rng(1234);
  bool failed = false;

  if (do_check) {
    // A small problem checked in full: uneven lengths and partial last pages; FlashMLA
    // splits the long requests over its num_sms / 4 SM parts, so the split path and the
    // combine both run. The 56-token request makes one key ~2% of a row's softmax, so a
    // causal-frontier error moves its LSE well past the tolerance.
    const std::vector<int> lens = {1000 + 16, 40 + 16, 2100 + 16, 333 + 16};
    Problem p(int(lens.size()), 16, 16, lens, 1.f / std::sqrt(float(kDqk)), 1, num_sms, rng);
    p.call(0, nullptr, true);
    CK(cudaDeviceSynchronize());
    std::vector<std::array<int, 3>> rows;
    for (int r = 0; r < p.b; ++r)
      for (int t = 0; t < p.s_q; ++t)
        for (int h = 0; h < p.h_q; ++h) rows.push_back({r, t, h});
    const Problem::Err e = p.check(rows);
    const bool ok = !e.nan && e.rel <= kMaxRel && e.lse <= kMaxLseErr;
    std::printf("check b=4 h=16 n=16 lens=1016,56,2116,349 parts=%d: max rel err %.2e, max lse err %.2e%s -> %s\n",
                p.num_sm_parts, e.rel, e.lse, e.nan ? ", NaN in output" : "", ok ? "ok" : "FAIL");
    if (!ok) return 1;  // timings of a wrong harness are worthless
  }

  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  if (json_path && !json) {
    std::fprintf(stderr, "bench_flashmla: cannot write %s\n", json_path);
    return 1;
  }
  std::printf("floor = max(FLOPs / %.0f TFLOP/s, bytes / %.0f GB/s); %d iterations, medians\n", tflops, gbps, iters);
  std::printf("%-29s %9s %9s %8s %8s %11s %9s %8s %8s %8s %5s %9s\n", "shape", "us", "nometa_us", "b2b_us",
              "graph_us", "graph_nm_us", "floor_us", "TFLOP/s", "KV_GB/s", "of_floor", "parts", "check");

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // Single-call event timing: the median over iters calls, rotating the input copies.
  auto time_calls = [&](auto&& fn) {
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
      CK(cudaEventRecord(e0, stream));
      fn(i);
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    return median(ms);
  };

  for (const auto& s : kdtree::bench::kVerifyShapes) {
    if (s.head_qk != kDqk || s.head_v != kDv || s.kv_heads != 1 || s.page != kPage) continue;  // MLA rows only
    if (only && std::strncmp(only, s.name, std::strlen(only))) continue;
    const int kv_len = s.prefix + s.nodes;
    const int pages_per_req = (kv_len + kPage - 1) / kPage;
    const double kv_bytes = double(pages_per_req) * s.batch * kPage * kDqk * 2;
    const int copies = std::clamp(int(std::ceil(256e6 / kv_bytes)), 2, 12);
    Problem p(s.batch, s.nodes, s.q_heads, std::vector<int>(s.batch, kv_len), 1.f / std::sqrt(float(kDqk)), copies,
              num_sms, rng);

    for (int i = 0; i < 5; ++i) p.call(i % copies, stream, true);  // warm up
    CK(cudaStreamSynchronize(stream));
    std::string check_text = "-";
    if (do_check) {
      // Sampled rows: first and last token of the first and last request, and random ones.
      std::vector<std::array<int, 3>> rows = {{0, 0, 0}, {0, s.nodes - 1, s.q_heads - 1},
                                              {s.batch - 1, 0, s.q_heads - 1}, {s.batch - 1, s.nodes - 1, 0}};
      std::uniform_int_distribution<int> rb(0, s.batch - 1), rt(0, s.nodes - 1), rh(0, s.q_heads - 1);
      for (int i = 0; i < 4; ++i) rows.push_back({rb(rng), rt(rng), rh(rng)});
      // The last warm-up call used copy 4 % copies; the reference reads copy 0's data,
      // which every copy holds.
      const Problem::Err e = p.check(rows);
      const bool ok = !e.nan && e.rel <= kMaxRel && e.lse <= kMaxLseErr;
      char buf[32];
      std::snprintf(buf, sizeof buf, ok ? "%.1e" : "FAIL:%.1e", e.rel);
      check_text = buf;
      failed |= !ok;
    }
    const double us = time_calls([&](int i) { p.call(i % copies, stream, true); });
    const double nometa_us = time_calls([&](int i) { p.call(i % copies, stream, false); });
    CK(cudaEventRecord(e0, stream));
    for (int i = 0; i < iters; ++i) p.call(i % copies, stream, true);
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float total_ms = 0;
    CK(cudaEventElapsedTime(&total_ms, e0, e1));
    const double b2b_us = total_ms * 1e3 / iters;

    // CUDA graphs: one per input copy, for the whole call and for MLA + combine.
    double graph_us[2];
    for (int with_meta = 1; with_meta >= 0; --with_meta) {
      std::vector<cudaGraphExec_t> graphs(copies);
      for (int c = 0; c < copies; ++c) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        p.call(c, stream, with_meta);
        CK(cudaStreamEndCapture(stream, &g));
        CK(cudaGraphInstantiate(&graphs[c], g, 0));
        CK(cudaGraphDestroy(g));
      }
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(graphs[i % copies], stream));  // upload
      CK(cudaStreamSynchronize(stream));
      graph_us[with_meta] = time_calls([&](int i) { CK(cudaGraphLaunch(graphs[i % copies], stream)); });
      for (auto g : graphs) CK(cudaGraphExecDestroy(g));
    }
    CK(cudaStreamSynchronize(stream));
    CK(cudaGetLastError());

    const int rows = s.batch * s.nodes * s.q_heads;
    const double flops = 2.0 * rows * double(kv_len) * (kDqk + kDv);
    const double bytes = double(s.batch) * kv_len * kDqk * 2 + double(rows) * (kDqk + kDv) * 2;
    const double floor_us = std::max(flops / (tflops * 1e6), bytes / (gbps * 1e3));
    std::printf("%-29s %9.1f %9.1f %8.1f %8.1f %11.1f %9.1f %8.1f %8.0f %7.0f%% %5d %9s\n", s.name, us, nometa_us,
                b2b_us, graph_us[1], graph_us[0], floor_us, flops / us / 1e6, bytes / us / 1e3,
                100.0 * floor_us / us, p.num_sm_parts, check_text.c_str());
    std::fflush(stdout);
    if (json)
      std::fprintf(json,
                   "{\"impl\":\"flashmla\",\"flashmla_rev\":\"%s\",\"shape\":\"%s\",\"batch\":%d,\"q_heads\":%d,"
                   "\"nodes\":%d,\"prefix\":%d,\"kv_len\":%d,\"us\":%.2f,\"nometa_us\":%.2f,\"b2b_us\":%.2f,"
                   "\"graph_us\":%.2f,\"graph_nometa_us\":%.2f,\"floor_us\":%.2f,\"tflops\":%.1f,\"gbps\":%.0f,"
                   "\"num_sm_parts\":%d,\"check\":\"%s\"}\n",
                   BENCH_FLASHMLA_REV, s.name, s.batch, s.q_heads, s.nodes, s.prefix, kv_len, us, nometa_us, b2b_us,
                   graph_us[1], graph_us[0], floor_us, flops / us / 1e6, bytes / us / 1e3, p.num_sm_parts,
                   check_text.c_str());
  }
  if (json) std::fclose(json);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  if (failed) std::fprintf(stderr, "bench_flashmla: a shape's sampled check FAILED\n");
  return failed ? 1 : 0;
}
