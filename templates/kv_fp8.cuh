// e4m3 KV caches in the verify_attention kernels: the rows stay fp8 in shared
// memory (half the bytes of a 16-bit cache through HBM, cp.async and shared
// memory), and each fragment is dequantised to q's 16-bit type on its way to the
// tensor cores (exact: every e4m3 value is a bf16 and an f16 value). The cache
// scales are applied outside the loop: k_scale in the score scale, v_scale on O.
//
// Fragment layouts (ldmatrix reads 16-bit elements, i.e. pairs of fp8 bytes):
//  - K (B of S = Q K^T): an 8-token x 16-byte matrix gives lane (g, t) dims
//    4t .. 4t + 3 of token g; dequantised, b0 = dims 4t, 4t+1 and b1 = dims
//    4t+2, 4t+3. The m16n8k16 mma reads b0 as k = 2t, 2t+1 and b1 as k = 8+2t,
//    9+2t, so Q's dims are permuted the same way within each 16-dim group when Q
//    is staged (load_q_tile_kv_fp8): the products pair up as in Q K^T.
//  - V (B of O = P V): the transposing ldmatrix of 8 tokens x 16 bytes gives lane
//    (g, t) dims 2g, 2g+1 of tokens 2t, 2t+1; byte selects make the B fragments of
//    two n8 tiles, one of the even dims 2g and one of the odd dims 2g+1 of the
//    16-dim block. Tokens keep their order, so P is unchanged; O's columns come
//    out interleaved, and write_row stores lane t's four dims 4t .. 4t+3 of a block
//    from the even and odd tiles' values.
#ifndef KDTREE_KV_FP8_CUH
#define KDTREE_KV_FP8_CUH

#include "common.cuh"

static __device__ __forceinline__ void kd_ldmatrix_x1(kd_u32& r, kd_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(addr));
}
static __device__ __forceinline__ void kd_ldmatrix_x2_trans(kd_u32 (&r)[2], kd_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// The x2 transposing load into the first two words of a 4-word fragment buffer.
static __device__ __forceinline__ void kd_ldmatrix_x2_trans_lo(kd_u32 (&r)[4], kd_u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Byte selectors (prmt) that put two e4m3 bytes of a word into the high bytes of
// its 16-bit halves, [0, a, 0, b]: bytes 0,1 / 2,3 (K) and 0,2 / 1,3 (V).
constexpr kd_u32 E4M3_BYTES_01 = 0x1404u, E4M3_BYTES_23 = 0x3424u;
constexpr kd_u32 E4M3_BYTES_02 = 0x2404u, E4M3_BYTES_13 = 0x3414u;

// Two e4m3 values of `x` (chosen by SEL) as a packed 16-bit pair of q's type.
// The sign stays in bit 15 and exponent and mantissa move to the 16-bit type's
// places; the product with 2^(bias difference) then gives the exact value,
// subnormals included (bf16: x 2^120; f16: x 2^8). The NaN code reads as 480.
template <bool BF16, kd_u32 SEL>
static __device__ __forceinline__ kd_u32 kd_e4m3x2_to_16(kd_u32 x) {
  const kd_u32 y = __byte_perm(x, 0u, SEL);
  kd_u32 r;
  if (BF16) {
    const kd_u32 h = ((y >> 4) & 0x07ff07ffu) | (y & 0x80008000u);
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(h), "r"(0x7b807b80u), "r"(0x80008000u));
  } else {
    const kd_u32 h = ((y >> 1) & 0x3fff3fffu) | (y & 0x80008000u);
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(h), "r"(0x5c005c00u), "r"(0x80008000u));
  }
  return r;
}

#endif  // KDTREE_KV_FP8_CUH
