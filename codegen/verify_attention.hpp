// verify_attention: spec validation, tile choice per arch, and source generation.
#pragma once
#include <string>
#include <vector>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
#include "codegen/shapes.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

// The compile-time part of kdtree_verify_spec (head counts are run-time values).
struct VerifySpec {
  int head_dim_qk = 576;
  int head_dim_v = 512;
  int page_size = 64;
  int max_tree_nodes = 64;
  kdtree_dtype dtype = KDTREE_DTYPE_BF16;           // q and out
  kdtree_kv_dtype kv_dtype = KDTREE_KV_DTYPE_AS_Q;  // the caches

  bool mla() const { return head_dim_qk == 576; }
  bool kv_fp8() const { return kv_dtype == KDTREE_KV_DTYPE_E4M3; }
  int kv_bytes() const { return kv_fp8() ? 1 : 2; }  // bytes per cached element
  // bytes one token's cached rows take per KV head: K and V, or MLA's one row (V is its first dims)
  int kv_row_bytes() const { return (head_dim_qk + (mla() ? 0 : head_dim_v)) * kv_bytes(); }
  // "mla576/512" or "gqa128"
  std::string head_name() const;
  // "verify_attention[mla576/512,W=64,page=64,bf16]", with ",kv=e4m3" before the
  // bracket for fp8 caches
  std::string label() const;
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED naming the supported values, or
// KDTREE_ERROR_INVALID_ARGUMENT for inconsistent head counts.
VerifySpec validate_verify_spec(const kdtree_verify_spec& spec);

// Parses a head name as printed by head_name() ("mla576/512", "gqa64", ...).
// Throws KDTREE_ERROR_UNSUPPORTED listing the accepted names.
void parse_head_name(const std::string& name, int* head_dim_qk, int* head_dim_v);

const char* dtype_name(kdtree_dtype dtype);           // "bf16", "f16", "f32"
const char* kv_dtype_name(kdtree_kv_dtype kv_dtype);  // "as_q", "e4m3"
kdtree_dtype parse_dtype(const std::string& name);

// The verify_attention kernel families. Each is one template with its own
// shared-memory layout and tile rules; the generator picks one per spec and arch
// (choose_verify_tiles), KDTREE_VERIFY_TILES can force one for tuning.
enum class VerifyKernel {
  // templates/verify_attention.cu: Q tile in shared memory, the column warps of a
  // warp row split the KV columns of S and the V columns of O (sm_80 .. sm_90).
  flash,
  // templates/verify_attention_qsplit.cu: MLA with Q in registers, column warps
  // split its head dim; shared memory holds KV stages and exchanges only, for
  // 99 KB parts (sm_86/89, sm_120). Runs stream-K plans. With mma=e4m3 (sm_120's
  // MLA kernel for e4m3 caches) Q is held as e4m3 codes, tiles are 32 tokens and
  // each column warp reduces an 8-row quarter of its warp row's scores.
  qsplit,
  // templates/verify_attention_wgmma.cu: MLA on Hopper's warpgroup MMA (sm_90a
  // only): Q, K stages and P in 128-byte swizzled shared memory read by wgmma
  // descriptors, two warpgroups over 64 rows. Runs stream-K plans. With mma=e4m3
  // (e4m3 caches; templates/verify_attention_wgmma_e4m3.cu) on the native e4m3
  // wgmma: Q and P quantised, PV computed transposed (O^T = V^T P^T).
  wgmma,
};
const char* kernel_name(VerifyKernel kernel);  // "flash", "qsplit", "wgmma"
// The kernel named `name`, or false.
bool parse_kernel_name(const std::string& name, VerifyKernel* kernel);

// A verify_attention kernel's tiling: the family and its tile fields.
struct VerifyTiles {
  VerifyKernel kernel = VerifyKernel::flash;
  int block_m = 64;    // rows (node x head) per CTA
  int block_n = 64;    // KV tokens per pipeline stage
  int warps = 4;       // warps per CTA: warps_m() warp rows x warps_n() column warps
  int stages = 2;      // cp.async pipeline depth
  int warp_rows = 16;  // rows per warp (16 or 32): 32 halves the B-operand loads per mma
  // e4m3 caches, flash or qsplit: QK and PV on e4m3 MMAs with Q and P quantised
  // to e4m3 ("mma=e4m3"; sm_89 and newer), instead of dequantising K and V to q's
  // type ("mma=16bit", the only form for 16-bit caches).
  bool mma_e4m3 = false;

  int warps_m() const { return block_m / warp_rows; }  // warp rows
  int warps_n() const { return warps / warps_m(); }    // column warps per warp row
  // "kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32" (and
  // ",mma=e4m3" on the e4m3 MMA path): the KDTREE_VERIFY_TILES spelling, used in
  // logs, bench output and tools.
  std::string str() const;
};

// The dynamic shared memory of one CTA of each family, in byte offsets. The
// template places its buffers at these offsets (the generator passes them as
// KD_SMEM_*); the launch asks for `bytes`. str() prints "name=offset,...,bytes=N".
// flash: Q | Q's row scales (e4m3 MMA: [block_m] floats) | K stages | V stages
// (GQA) | P (column warps > 1) | the row exchange ([warps_n][block_m] floats).
// On the e4m3 MMA path Q and P hold e4m3 codes.
struct FlashSmemLayout {
  int q = 0, q_scale = 0, k = 0, v = 0, p = 0, red = 0;
  int bytes = 0;
  std::string str() const;
};
// qsplit: K stages (Q is staged at 0 before the loop) | partial S
// ([warps][warp_rows][block_n] floats; mma=e4m3: [warps][3][block_n / 8][32 lanes]
// [2] floats, the three 8-row quarters a warp hands on) | P (16-bit; mma=e4m3:
// e4m3 codes) | stats ([KDTREE_QSPLIT_STATS][block_m] floats) | the segment walk
// (KDTREE_SEGMENT_WALK_BYTES), which starts past Q's staged tile: Q is staged from
// offset 0 while the walk is live (16-bit rows; mma=e4m3: e4m3 rows as the K
// stages' and its [block_m] float row scales at q_scale). mma=e4m3 keeps MLA's
// 576-byte e4m3 rows unpadded (36 chunks, not 40), so four 32-token stages fit.
struct QsplitSmemLayout {
  int k = 0, part_s = 0, p = 0, stats = 0, q_scale = 0, walk = 0;
  int bytes = 0;
  std::string str() const;
};
// wgmma: Q's latent dims (BLOCK_M x head_dim_v 16-bit, 64-dim column blocks) |
// slot 1's P (BLOCK_M x block_n 16-bit, where Q's rope block would lie: the rope
// stays in registers) | K slots | slot 0's P | the row exchange ([2][block_m]
// floats) | the copies' mbarriers ([stages][3] x 8 bytes) | each slot's token rows
// as cache slot indices ([stages][block_n] x 4 bytes) | the segment walk.
// mma=e4m3 (e4m3 caches): Q's latent dims (block_m x 512 codes, 128-dim column
// blocks) | K slots | slot 0's P | slot 1's P (block_m rows of 128 bytes each) |
// the row exchange | the scales ([2][block_m] rescale factors, [block_m] Q row
// scales) | the mbarriers, rows and walk as above.
// Every operand buffer starts on a 1024-byte swizzle atom.
// GQA (templates/verify_attention_wgmma_gqa.cu): Q (block_m x head_dim 16-bit) | K
// stages | V stages (block_n x head_dim each) | mbarriers ([stages] full, [stages]
// empty); no segment walk (uniform splits: a CTA's one segment is its grid point).
struct WgmmaSmemLayout {
  int q = 0, p1 = 0, k = 0, v = 0, p = 0, red = 0, scale = 0, bar = 0, rows = 0, walk = 0;
  int raw = 0, raw_stages = 0;  // GQA over e4m3 caches: the tiles' cache bytes before their dequantisation
  int bytes = 0;
  std::string str() const;
};
FlashSmemLayout flash_smem_layout(const VerifySpec& spec, const VerifyTiles& tiles);
QsplitSmemLayout qsplit_smem_layout(const VerifySpec& spec, const VerifyTiles& tiles);
WgmmaSmemLayout wgmma_smem_layout(const VerifySpec& spec, const VerifyTiles& tiles);
// The bytes of the layout of tiles.kernel.
int verify_smem_bytes(const VerifySpec& spec, const VerifyTiles& tiles);

// Whether the generator's tiles for e4m3 caches on `arch` use the e4m3 MMA path
// (mma=e4m3) rather than dequantising K and V.
bool prefers_e4m3_mma(const Arch& arch);

// The generator's choice for an arch: the first candidate (in order of
// preference) whose shared memory fits. Pure: no environment is read.
VerifyTiles choose_verify_tiles(const VerifySpec& spec, const Arch& arch);

// The tuning override KDTREE_VERIFY_TILES="key=value,..." with the keys of
// VerifyTiles::str() (kernel, block_m, block_n, warps, stages, warp_rows, mma), each at
// most once; a key left out keeps the generator's choice for the spec and arch
// (choose_verify_tiles; with kernel=wgmma, that family's one tiling). Ranges: kernel flash, qsplit or wgmma;
// block_m 16..256, a multiple of warp_rows; block_n 16..256, a multiple of 16 (flash: and of 8 x the column warps);
// warps 1..32, a multiple of block_m / warp_rows; stages 2..8; warp_rows 16 or 32; head_dim_v a multiple of 64 x the
// column warps; qsplit is MLA only, with block_n 16 and warp_rows = 8 x the column warps (mma=e4m3: block_n 32,
// warp_rows 32, 2 warp rows of 4 column warps, stages >= 3); wgmma is MLA on sm_90 only, mma=16bit over 16-bit
// caches and mma=e4m3 over e4m3 ones (kernel=wgmma alone picks the cache's), with exactly
// block_m=64,block_n=64,warps=8,warp_rows=16 and stages=2 (mma=e4m3: 4, or 2); a family other than the generator's
// named without mma takes the form the generator gives that family on the arch; mma 16bit or e4m3 (e4m3 caches, block_n
// a multiple of 32, sm_89 and newer). The tiles must fit the arch's shared memory. Throws KDTREE_ERROR_INVALID_ARGUMENT
// naming KDTREE_VERIFY_TILES and the key otherwise; the old positional form ("64,16,8,4,32,qsplit") is refused with its
// key=value spelling.
VerifyTiles parse_verify_tiles(const std::string& text, const VerifySpec& spec, const Arch& arch);

// The tiles kernels are generated with: parse_verify_tiles of KDTREE_VERIFY_TILES
// when it is set and not empty, else choose_verify_tiles.
VerifyTiles verify_tiles(const VerifySpec& spec, const Arch& arch);

// Source with entry points "kdtree_verify_attention" and "kdtree_verify_combine",
// and its launch facts (threads, shared memory, block_m/block_n, combine rows).
KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch, const VerifyTiles& tiles);
// The same with verify_tiles(spec, arch).
KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
