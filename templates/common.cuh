// Device prelude shared by every generated kernel. No CUDA headers: NVRTC sees
// only the headers the generator names, so 16-bit values are plain integers and
// conversions and matrix instructions are inline PTX.
#ifndef KDTREE_COMMON_CUH
#define KDTREE_COMMON_CUH

// The KDTREE_DEVICE_ERROR_* bits kernels OR into error_flags are kdtree.h's
// (plain C, no includes); NVRTC receives the header by this name.
#include "kdtree/kdtree_device_errors.h"

typedef unsigned int kd_u32;
typedef unsigned long long kd_u64;
typedef unsigned short kd_u16;

#define KD_INF __int_as_float(0x7f800000)
#define KD_NAN __int_as_float(0x7fffffff)

static __device__ __forceinline__ kd_u32 kd_smem_addr(const void* p) {
  kd_u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// 16-byte async copy global -> shared; src_bytes 0 zero-fills (out-of-range rows).
static __device__ __forceinline__ void kd_cp_async16(kd_u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void kd_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void kd_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void kd_ldmatrix_x4(kd_u32 (&r)[4], kd_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void kd_ldmatrix_x2(kd_u32 (&r)[2], kd_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
static __device__ __forceinline__ void kd_ldmatrix_x4_trans(kd_u32 (&r)[4], kd_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D += A(16x16, row) * B(16x8, col), fp32 accumulate. BF16 selects the input type.
template <bool BF16>
static __device__ __forceinline__ void kd_mma16816(float (&d)[4], const kd_u32 (&a)[4], kd_u32 b0, kd_u32 b1) {
  if (BF16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> packed 16-bit pair (lo in the low half), round to nearest even.
template <bool BF16>
static __device__ __forceinline__ kd_u32 kd_pack2(float lo, float hi) {
  kd_u32 r;
  if (BF16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// The inverse: a packed 16-bit pair -> two floats (exact).
template <bool BF16>
static __device__ __forceinline__ float2 kd_unpack2(kd_u32 v) {
  if (BF16) return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  float lo, hi;
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(v));
  return make_float2(lo, hi);
}

static __device__ __forceinline__ float kd_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

static __device__ __forceinline__ float kd_log2(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90+; no-ops below, where the runtime launches
// the next kernel the ordinary way). A kernel that signals lets the stream's next
// kernel, launched with programmatic stream serialization, start its CTAs (and
// whatever precedes its wait) while this grid finishes; kd_grid_dependency_wait
// returns once the previous grid has completed and its writes are visible.
static __device__ __forceinline__ void kd_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void kd_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Thread-block clusters (sm_90+; the host launches a cluster only there, and these
// compile to nothing below). kd_cluster_sync: every thread of every CTA of the
// cluster arrives, and shared-memory writes before it (release) are visible to
// reads after it (acquire) from any CTA of the cluster.
static __device__ __forceinline__ kd_u32 kd_cluster_rank() {
  kd_u32 r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

static __device__ __forceinline__ void kd_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

// The shared::cluster address of shared address `addr` (kd_smem_addr) in CTA `rank`
// of the cluster; a CTA's shared memory is one contiguous window there.
static __device__ __forceinline__ kd_u32 kd_cluster_map(kd_u32 addr, kd_u32 rank) {
  kd_u32 r = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
#endif
  return r;
}

static __device__ __forceinline__ kd_u32 kd_ld_cluster_u32(kd_u32 addr) {
  kd_u32 v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
#endif
  return v;
}

static __device__ __forceinline__ uint4 kd_ld_cluster_v4(kd_u32 addr) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}

static __device__ __forceinline__ float kd_ld_cluster_f32(kd_u32 addr) { return __uint_as_float(kd_ld_cluster_u32(addr)); }

#endif  // KDTREE_COMMON_CUH
