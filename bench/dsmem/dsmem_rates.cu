// Distributed shared memory rates of a thread-block cluster, the three constants the
// performance model charges for splits merged in a cluster (tools/perf_model/rates.py:
// dsmem_latency, dsmem_bytes_per_clk_sm, cluster_barrier_cycles):
//   barrier   cycles of one cluster barrier (barrier.cluster.arrive.release + wait.acquire),
//             every thread of both CTAs taking part, as cluster_merge's barriers do;
//   latency   cycles of one dependent 4-byte load from the peer CTA's shared memory
//             (a pointer chase, one thread), and from the CTA's own for comparison;
//   bytes     bytes per clock an SM reads from its peer's shared memory with 16-byte
//             loads by all 256 threads (cluster_merge's loads), every SM of the GPU in
//             clusters of two, one CTA an SM (a CTA takes 150 KB so none share an SM).
// Timed with clock64 inside the kernel (median over CTAs). Standalone: nvcc, no kdtree.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/dsmem/dsmem_rates.cu -o dsmem_rates && ./dsmem_rates
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK_CUDA(x)                                                                            \
  do {                                                                                           \
    cudaError_t e = (x);                                                                         \
    if (e != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int kThreads = 256;
constexpr int kSmemBytes = 150 * 1024;  // one CTA an SM
constexpr int kReadBytes = 64 * 1040;   // one split's stash: 64 rows of 520 16-bit values
constexpr int kChase = 512;             // dependent loads per chase
constexpr int kBarriers = 256;
constexpr int kPasses = 16;

struct Stamps {
  long long barrier, chase_remote, chase_local, read_remote, read_local;
  unsigned sink;
};

__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned remote_addr(const void* local, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(out)
               : "r"((unsigned)__cvta_generic_to_shared(local)), "r"(rank));
  return out;
}

__device__ __forceinline__ unsigned ld_cluster_u32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint4 ld_cluster_v4(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1) dsmem_rates(Stamps* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), peer = rank ^ 1u;
  unsigned* words = reinterpret_cast<unsigned*>(smem);
  // A chase ring of stride 33 words (distinct banks), then the bytes to read.
  for (int i = threadIdx.x; i < kSmemBytes / 4; i += kThreads) words[i] = ((i + 33) % (kChase * 33)) * 4u;
  cluster_barrier();

  Stamps s{};
  long long t0 = clock64();
  for (int i = 0; i < kBarriers; ++i) cluster_barrier();
  s.barrier = clock64() - t0;

  unsigned sink = 0;
  if (threadIdx.x == 0) {
    const unsigned base_remote = remote_addr(smem, peer), base_local = remote_addr(smem, rank);
    unsigned off = 0;
    t0 = clock64();
    for (int i = 0; i < kChase; ++i) off = ld_cluster_u32(base_remote + off);
    s.chase_remote = clock64() - t0;
    sink += off;
    off = 0;
    t0 = clock64();
    for (int i = 0; i < kChase; ++i) off = ld_cluster_u32(base_local + off);
    s.chase_local = clock64() - t0;
    sink += off;
  }
  cluster_barrier();

  for (int which = 0; which < 2; ++which) {
    const unsigned base = remote_addr(smem, which == 0 ? peer : rank);
    cluster_barrier();
    t0 = clock64();
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int pass = 0; pass < kPasses; ++pass) {
#pragma unroll 4
      for (int b = threadIdx.x * 16; b < kReadBytes; b += kThreads * 16) {
        const uint4 v = ld_cluster_v4(base + b);
        acc.x ^= v.x;
        acc.y += v.y;
        acc.z ^= v.z;
        acc.w += v.w;
      }
    }
    sink += acc.x + acc.y + acc.z + acc.w;
    __syncthreads();
    const long long t = clock64() - t0;
    (which == 0 ? s.read_remote : s.read_local) = t;
  }
  cluster_barrier();  // the peer's shared memory stays until both have read it
  s.sink = sink;
  if (threadIdx.x == 0) out[blockIdx.x] = s;
  else if (sink == 0xdeadbeefu) out[blockIdx.x].sink = sink;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  int dev = 0, sms = 0, major = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) {
    std::printf("dsmem_rates: thread-block clusters need sm_90 or newer; skipped\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  CHECK_CUDA(cudaFuncSetAttribute(dsmem_rates, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  int max_clusters = 0;
  {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(sms & ~1);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    CHECK_CUDA(cudaOccupancyMaxActiveClusters(&max_clusters, dsmem_rates, &cfg));
  }
  const int ctas = 2 * max_clusters;  // every cluster resident at once
  Stamps* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, sizeof(Stamps) * ctas));
  std::vector<Stamps> h(ctas);
  for (int rep = 0; rep < 3; ++rep) {  // the last of three launches (the first warms up)
    dsmem_rates<<<ctas, kThreads, kSmemBytes>>>(d);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  CHECK_CUDA(cudaMemcpy(h.data(), d, sizeof(Stamps) * ctas, cudaMemcpyDeviceToHost));
  std::vector<double> bar, lat_r, lat_l, bw_r, bw_l;
  for (const Stamps& s : h) {
    bar.push_back(double(s.barrier) / kBarriers);
    lat_r.push_back(double(s.chase_remote) / kChase);
    lat_l.push_back(double(s.chase_local) / kChase);
    bw_r.push_back(double(kReadBytes) * kPasses / double(s.read_remote));
    bw_l.push_back(double(kReadBytes) * kPasses / double(s.read_local));
  }
  std::printf("dsmem_rates: %s (sm_%d%d), %d SMs, %d clusters of 2 resident (%d CTAs)\n", prop.name, prop.major,
              prop.minor, sms, max_clusters, ctas);
  std::printf("cluster barrier                 %8.1f cycles\n", median(bar));
  std::printf("remote load latency (chase)     %8.1f cycles   (own shared memory through mapa: %.1f)\n",
              median(lat_r), median(lat_l));
  std::printf("remote read, 16 B loads         %8.2f B/clk an SM  (own shared memory, same loads: %.2f)\n",
              median(bw_r), median(bw_l));
  CHECK_CUDA(cudaFree(d));
  return 0;
}
