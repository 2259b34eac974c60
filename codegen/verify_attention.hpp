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
  kdtree_dtype dtype = KDTREE_DTYPE_BF16;

  bool mla() const { return head_dim_qk == 576; }
  // "mla576/512" or "gqa128"
  std::string head_name() const;
  // "verify_attention[mla576/512,W=64,page=64,bf16]"
  std::string label() const;
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED naming the supported values, or
// KDTREE_ERROR_INVALID_ARGUMENT for inconsistent head counts.
VerifySpec validate_verify_spec(const kdtree_verify_spec& spec);

// Parses a head name as printed by head_name() ("mla576/512", "gqa64", ...).
// Throws KDTREE_ERROR_UNSUPPORTED listing the accepted names.
void parse_head_name(const std::string& name, int* head_dim_qk, int* head_dim_v);

const char* dtype_name(kdtree_dtype dtype);  // "bf16", "f16", "f32"
kdtree_dtype parse_dtype(const std::string& name);

// A verify_attention kernel's tiling.
struct VerifyTiles {
  int block_m = 64;  // rows (node x head) per CTA
  int block_n = 64;  // KV tokens per pipeline stage
  int warps = 4;
  int stages = 2;
  int warp_rows = 16;  // rows per warp (16 or 32): 32 halves the B-operand loads per mma
  // The kernel structure: false = templates/verify_attention.cu (Q tile in shared
  // memory, column warps split the KV columns of S); true =
  // templates/verify_attention_qsplit.cu (MLA: Q in registers, column warps split its
  // head dim; shared memory holds only KV stages and exchanges, for 99 KB parts).
  bool qsplit = false;

  int warps_m() const { return block_m / warp_rows; }  // warp rows
  int warps_n() const { return warps / warps_m(); }    // column warps per warp row
};

// The dynamic shared memory of one CTA, in byte offsets. The template places its
// buffers at these offsets; the launch asks for `bytes`.
// flash:  Q (at 0) | K stages | V stages (GQA) | P (column warps > 1) | the row
//         exchange ([warps_n][block_m] floats).
// qsplit: K stages (at 0; Q is staged there before the loop) | partial S
//         ([warps][warp_rows][block_n] floats) | P | stats ([3][block_m] floats,
//         then 128 bytes of segment walk); at least Q's size.
struct VerifySmemLayout {
  int k = 0, v = 0, p = 0, red = 0, stats = 0;  // offsets
  int bytes = 0;                                // total
};
VerifySmemLayout verify_smem_layout(const VerifySpec& spec, const VerifyTiles& tiles);

// The generator's choice for an arch: the first candidate (in order of
// preference) whose shared memory fits. Pure: no environment is read.
VerifyTiles choose_verify_tiles(const VerifySpec& spec, const Arch& arch);

// The tuning override KDTREE_VERIFY_TILES="block_m,block_n,warps,stages[,warp_rows[,kernel]]"
// (kernel: flash or qsplit, default flash; qsplit is MLA's 64,16,8,S,32 only),
// outside the generator's normal path. Every field must be an integer in range
// (block_m 16..256, a multiple of warp_rows; block_n 16..256, a multiple of 16
// and of 8 * the column warps; warps 1..32, a multiple of block_m / warp_rows;
// stages 2..8; warp_rows 16 or 32; head_dim_v a multiple of 64 * the column
// warps) with nothing else in the text, and the tiles must fit the arch's shared
// memory. Throws KDTREE_ERROR_INVALID_ARGUMENT naming KDTREE_VERIFY_TILES and the
// field otherwise.
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
