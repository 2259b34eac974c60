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

// The exact 16-bit values of e4m3 fields h already in the 16-bit type's places (sign in
// bit 15, exponent and mantissa below it): the product with 2^(bias difference), subnormals
// included (bf16: x 2^120; f16: x 2^8).
template <bool BF16>
static __device__ __forceinline__ kd_u32 kd_e4m3_fields_to_16(kd_u32 h) {
  kd_u32 r;
  if (BF16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(h), "r"(0x7b807b80u), "r"(0x80008000u));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(h), "r"(0x5c005c00u), "r"(0x80008000u));
  }
  return r;
}

// Two e4m3 values of `x` (chosen by SEL) as a packed 16-bit pair of q's type.
// The sign stays in bit 15 and exponent and mantissa move to the 16-bit type's
// places (kd_e4m3_fields_to_16). The NaN code reads as 480.
template <bool BF16, kd_u32 SEL>
static __device__ __forceinline__ kd_u32 kd_e4m3x2_to_16(kd_u32 x) {
  const kd_u32 y = __byte_perm(x, 0u, SEL);
  return kd_e4m3_fields_to_16<BF16>(BF16 ? ((y >> 4) & 0x07ff07ffu) | (y & 0x80008000u)
                                         : ((y >> 1) & 0x3fff3fffu) | (y & 0x80008000u));
}

// Two e4m3 values picked from the eight bytes of (a, b) by a selector known only at run
// time (prmt's: the values go to bytes 1 and 3, bytes 0 and 2 are don't-care), as
// kd_e4m3x2_to_16 converts them, with masks that drop whatever bytes 0 and 2 hold: the
// one prmt chooses the word as well as the bytes. E4M3_FROM_B flips a selector's bytes
// 1 and 3 from a's to b's (0x1404 -> 0x5444, 0x3424 -> 0x7464).
constexpr kd_u32 E4M3_FROM_B = 0x4040u;
template <bool BF16>
static __device__ __forceinline__ kd_u32 kd_e4m3x2_pick_to_16(kd_u32 a, kd_u32 b, kd_u32 sel) {
  const kd_u32 y = __byte_perm(a, b, sel);
  return kd_e4m3_fields_to_16<BF16>(BF16 ? ((y >> 4) & 0x07f007f0u) | (y & 0x80008000u)
                                         : ((y >> 1) & 0x3f803f80u) | (y & 0x80008000u));
}

// ---- The e4m3 MMA path (MMA_E4M3): Q and P quantised to e4m3, QK and PV on
// m16n8k32 e4m3 tensor-core instructions with fp32 accumulation. Fragments are
// bytes: A (16 x 32) lane (g, t) holds k = 4t .. 4t+3 of rows g (a0), g+8 (a1)
// and k = 16+4t .. 19+4t of the same rows (a2, a3); B (32 x 8) k = 4t .. 4t+3
// (b0) and 16+4t .. 19+4t (b1) of column g; C as m16n8k16's.
//  - Q K^T: a non-transposing ldmatrix of 8 rows x 16 bytes gives lane (g, t)
//    bytes 4t .. 4t+3 of row g: exactly a0/a1 (Q rows) or b0/b1 (K tokens) of one
//    16-dim half of a k32 step, in order.
//  - P V: the transposing ldmatrix of tokens 8i .. 8i+7 x 16 bytes gives lane
//    (g, t) dims 2g, 2g+1 of tokens 8i+2t, 8i+2t+1 (r_i). One byte permute of r0
//    and r1 makes b0 of the even dims' n8 tile (dims 2g of the 16-dim block), one
//    more the odd dims' (2g+1), as in the dequantising path; b1 from r2, r3. So
//    k slots 4t .. 4t+3 of a 16-token half are tokens 2t, 2t+1, 8+2t, 9+2t, and P's
//    A fragment takes the same tokens: lane (g, t)'s own S columns 2t, 2t+1 of two
//    n8 tiles (kd_e4m3x4_pack), no exchange between lanes.

// e4m3 codes of four floats, a in the low byte (round to nearest even, saturating
// to +-448: P <= 2^LAZY_MAX_LOG2 and the quantised Q fit without it).
static __device__ __forceinline__ kd_u32 kd_e4m3x4_pack(float a, float b, float c, float d) {
  kd_u32 lo, hi;
  asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %2, %1; cvt.u32.u16 %0, t; }" : "=r"(lo) : "f"(a), "f"(b));
  asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %2, %1; cvt.u32.u16 %0, t; }" : "=r"(hi) : "f"(c), "f"(d));
  return lo | (hi << 16);
}

// e4m3 codes of two floats as 16 bits, a in the low byte.
static __device__ __forceinline__ kd_u16 kd_e4m3x2_pack(float a, float b) {
  kd_u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(r) : "f"(a), "f"(b));
  return r;
}

// Bytes 0, 2 of x then of y (the even dims of two transposed 8-token blocks), and
// bytes 1, 3 (the odd dims).
constexpr kd_u32 E4M3_EVEN_OF_PAIR = 0x6420u, E4M3_ODD_OF_PAIR = 0x7531u;

// D += A(16x32 e4m3, row) * B(32x8 e4m3, col), fp32 accumulate: the one MMA
// wrapper of the e4m3 path. BLOCK_SCALED (sm_120a): the block-scaled
// kind::mxf8f6f4 form with unit ue8m0 scales (2^0 = 0x7f), the double-rate
// QMMA.SF; otherwise the plain form (sm_89+: QMMA on sm_120, converted to f16
// HMMAs on sm_89/sm_90).
template <bool BLOCK_SCALED>
static __device__ __forceinline__ void kd_mma_e4m3(float (&d)[4], const kd_u32 (&a)[4], kd_u32 b0, kd_u32 b1) {
  if constexpr (BLOCK_SCALED) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%11}, %10, {%11,%11};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0x7f7f7f7fu), "h"((unsigned short)0));
  } else {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

#endif  // KDTREE_KV_FP8_CUH
