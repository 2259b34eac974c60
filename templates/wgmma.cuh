// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the wgmma verify_attention
// family: shared-memory matrix descriptors, the async fences and group waits, the
// shapes the MLA kernel issues, and the mbarriers its copies complete on. Operands
// in shared memory are laid out in 128-byte swizzle atoms: a 1024-byte block of 8
// rows of 128 bytes, 16-byte unit u of row r stored at unit u ^ (r % 8), atoms
// 1024-aligned (the address bits the hardware swizzles with are absolute). The
// "_rs" forms take A from registers instead.
#ifndef KDTREE_WGMMA_CUH
#define KDTREE_WGMMA_CUH

#include "common.cuh"

// A shared-memory matrix descriptor with 128-byte swizzling. addr: byte address of
// the operand's first element (an atom's base plus a 32-byte k16 step within its
// 128-byte rows for K-major operands); lbo, sbo: the leading and stride byte
// offsets (K-major: lbo unused, sbo = 1024 between 8-row groups; MN-major: lbo
// between 64-element column blocks, sbo = 1024 between 8-row k groups).
static __device__ __forceinline__ kd_u64 kd_wgmma_desc(kd_u32 addr, kd_u32 lbo, kd_u32 sbo) {
  kd_u64 d = 0;
  d |= (kd_u64)((addr & 0x3ffff) >> 4);
  d |= (kd_u64)((lbo & 0x3ffff) >> 4) << 16;
  d |= (kd_u64)((sbo & 0x3ffff) >> 4) << 32;
  d |= (kd_u64)1 << 62;  // 128-byte swizzle
  return d;
}

// Orders this thread's earlier register and shared-memory accesses before the
// warpgroup's next wgmma.mma_async (required before the first MMA of a batch).
static __device__ __forceinline__ void kd_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void kd_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of this warpgroup's committed MMA groups are pending.
template <int N>
static __device__ __forceinline__ void kd_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to the
// async proxy that wgmma reads its operands through; each writer fences, then the
// CTA synchronises.
static __device__ __forceinline__ void kd_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the async MMA
// that owns it (issued before and after each batch).
template <int N>
static __device__ __forceinline__ void kd_wgmma_pin(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+f"(d[i][k])::"memory");
  }
}

// The MMA shapes. A thread holds D rows 16 (warp % 4) + lane / 4 (+ 8) as mma.sync's C
// fragments: d[j] is n8 tile j. "_rs": A from registers, a[4] the thread's A fragment
// of the k16 step in mma.sync's m16n8k16 A layout over its warp's 16 rows (a[0]: row
// lane / 4, k 2 (lane % 4) + {0, 1}; a[1]: row + 8; a[2], a[3]: k + 8). The scale-d
// predicate is `accumulate` (false: D = A B).
#define KD_WGMMA_D32 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define KD_WGMMA_D32_LIST \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KD_WGMMA_D64 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]) \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]) \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]) \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]) \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]) \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]) \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define KD_WGMMA_D64_LIST \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KD_WGMMA_D128 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), \
    "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
    "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
    "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), \
    "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), \
    "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), \
    "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), \
    "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), \
    "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
#define KD_WGMMA_D128_LIST \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// One wgmma with its scale-d predicate taken from operand P; OPERANDS follow D.
#define KD_WGMMA_ASM(SHAPE, TYPE, DLIST, OPERANDS, P) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n" \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" DLIST "}, " OPERANDS ";\n}\n"

// D[64x64] (+)= A[64x16] B[16x64], both K-major (B: 64 rows of k): QK over one k16 step.
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n64k16(float (&d)[8][4], kd_u64 desc_a, kd_u64 desc_b, bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n64k16", "bf16", KD_WGMMA_D32_LIST, "%32, %33, p, 1, 1, 0, 0", "34")
                 : KD_WGMMA_D32 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n64k16", "f16", KD_WGMMA_D32_LIST, "%32, %33, p, 1, 1, 0, 0", "34")
                 : KD_WGMMA_D32 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  }
}
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n64k16_rs(float (&d)[8][4], const kd_u32 (&a)[4], kd_u64 desc_b,
                                                             bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n64k16", "bf16", KD_WGMMA_D32_LIST, "{%32, %33, %34, %35}, %36, p, 1, 1, 0", "37")
                 : KD_WGMMA_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n64k16", "f16", KD_WGMMA_D32_LIST, "{%32, %33, %34, %35}, %36, p, 1, 1, 0", "37")
                 : KD_WGMMA_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  }
}

// D[64x256] (+)= A[64x16] B[16x256], A K-major, B MN-major ("transposed": 16 rows of
// 256 contiguous columns, as V tokens lie): PV over one k16 step, 32 n8 tiles.
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n256k16_bt(float (&d)[32][4], kd_u64 desc_a, kd_u64 desc_b, bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n256k16", "bf16", KD_WGMMA_D128_LIST, "%128, %129, p, 1, 1, 0, 1", "130")
                 : KD_WGMMA_D128 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n256k16", "f16", KD_WGMMA_D128_LIST, "%128, %129, p, 1, 1, 0, 1", "130")
                 : KD_WGMMA_D128 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  }
}
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n256k16_bt_rs(float (&d)[32][4], const kd_u32 (&a)[4], kd_u64 desc_b,
                                                                 bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n256k16", "bf16", KD_WGMMA_D128_LIST, "{%128, %129, %130, %131}, %132, p, 1, 1, 1", "133")
                 : KD_WGMMA_D128 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n256k16", "f16", KD_WGMMA_D128_LIST, "{%128, %129, %130, %131}, %132, p, 1, 1, 1", "133")
                 : KD_WGMMA_D128 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  }
}

// D[64x128] (+)= A[64x16] B[16x128], both K-major: GQA's QK over one k16 step of a 128-token tile.
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n128k16(float (&d)[16][4], kd_u64 desc_a, kd_u64 desc_b, bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n128k16", "bf16", KD_WGMMA_D64_LIST, "%64, %65, p, 1, 1, 0, 0", "66")
                 : KD_WGMMA_D64 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n128k16", "f16", KD_WGMMA_D64_LIST, "%64, %65, p, 1, 1, 0, 0", "66")
                 : KD_WGMMA_D64 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  }
}

// PV of GQA's 64- and 128-dim heads over one k16 step, A (P) from registers, B (V) MN-major.
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n64k16_bt_rs(float (&d)[8][4], const kd_u32 (&a)[4], kd_u64 desc_b,
                                                                bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n64k16", "bf16", KD_WGMMA_D32_LIST, "{%32, %33, %34, %35}, %36, p, 1, 1, 1", "37")
                 : KD_WGMMA_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n64k16", "f16", KD_WGMMA_D32_LIST, "{%32, %33, %34, %35}, %36, p, 1, 1, 1", "37")
                 : KD_WGMMA_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  }
}
template <bool BF16>
static __device__ __forceinline__ void kd_wgmma_m64n128k16_bt_rs(float (&d)[16][4], const kd_u32 (&a)[4], kd_u64 desc_b,
                                                                 bool accumulate) {
  if constexpr (BF16) {
    asm volatile(KD_WGMMA_ASM("m64n128k16", "bf16", KD_WGMMA_D64_LIST, "{%64, %65, %66, %67}, %68, p, 1, 1, 1", "69")
                 : KD_WGMMA_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  } else {
    asm volatile(KD_WGMMA_ASM("m64n128k16", "f16", KD_WGMMA_D64_LIST, "{%64, %65, %66, %67}, %68, p, 1, 1, 1", "69")
                 : KD_WGMMA_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  }
}

// e4m3 (sm_90a; fp32 accumulation): D[64x64] (+)= A[64x32] B[32x64], both K-major (8-bit
// wgmma takes no transposed operand). "_rs": a[4] the thread's A fragment of the k32
// step in mma.sync's m16n8k32 layout over its warp's 16 rows (a[0]: row lane / 4,
// k 4 (lane % 4) .. + 3, the lowest k in the low byte; a[1]: row + 8; a[2], a[3]: k + 16).
static __device__ __forceinline__ void kd_wgmma_m64n64k32_e4m3(float (&d)[8][4], kd_u64 desc_a, kd_u64 desc_b,
                                                               bool accumulate) {
  asm volatile(KD_WGMMA_ASM("m64n64k32", "e4m3", KD_WGMMA_D32_LIST, "%32, %33, p, 1, 1", "34")
               : KD_WGMMA_D32 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}
static __device__ __forceinline__ void kd_wgmma_m64n64k32_e4m3_rs(float (&d)[8][4], const kd_u32 (&a)[4],
                                                                  kd_u64 desc_b, bool accumulate) {
  asm volatile(KD_WGMMA_ASM("m64n64k32", "e4m3", KD_WGMMA_D32_LIST, "{%32, %33, %34, %35}, %36, p, 1, 1", "37")
               : KD_WGMMA_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
}
#undef KD_WGMMA_ASM
#undef KD_WGMMA_D32
#undef KD_WGMMA_D32_LIST
#undef KD_WGMMA_D128
#undef KD_WGMMA_D128_LIST

// ---- mbarriers (shared memory, 8 bytes, 8-aligned): one thread initialises with
// the arrival count a phase takes; the CTA synchronises before first use.
static __device__ __forceinline__ void kd_mbar_init(kd_u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives on bar once all of this thread's earlier cp.async have landed; the
// arrival counts against the init count (.noinc).
static __device__ __forceinline__ void kd_cp_async_mbar_arrive(kd_u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// An arrival on bar; with `expect` true it also expects `bytes` of asynchronous
// copies (TMA) to complete on the barrier before its phase can. Predicated, not
// branched: a branch that differs across a warpgroup's threads would make ptxas
// serialise the wgmmas around it.
static __device__ __forceinline__ void kd_mbar_arrive(kd_u32 bar, bool expect, kd_u32 bytes) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"
      "@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
      "@!p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(bytes), "r"(int(expect))
      : "memory");
}
// TMA, when `on`: the box at element coordinates (x, y) of the tensor map `map`
// (a __grid_constant__ kernel parameter) into shared memory at dst, its bytes
// completing on bar. With 128-byte swizzling the pattern follows dst's address bits.
// EVICT_FIRST: the box's lines enter L2 as the first to be evicted (an L2 cache
// policy), for data a CTA streams through once.
template <bool EVICT_FIRST = false>
static __device__ __forceinline__ void kd_tma_load_2d(bool on, kd_u32 dst, const void* map, int x, int y, kd_u32 bar) {
  if constexpr (EVICT_FIRST) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 policy;\nsetp.ne.b32 p, %5, 0;\n"
        "createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
        "@p cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], policy;\n"
        "}\n" ::"r"(dst),
        "l"(map), "r"(x), "r"(y), "r"(bar), "r"(int(on))
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n"
        "@p cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        "}\n" ::"r"(dst),
        "l"(map), "r"(x), "r"(y), "r"(bar), "r"(int(on))
        : "memory");
  }
}
// Waits until the phase of the given parity has completed (acquire: the copies
// it tracked are visible to this thread).
static __device__ __forceinline__ void kd_mbar_wait(kd_u32 bar, kd_u32 parity) {
  kd_u32 done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

#endif  // KDTREE_WGMMA_CUH
