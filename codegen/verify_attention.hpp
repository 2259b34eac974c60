// verify_attention: spec validation, tile choice per arch, and source generation.
#pragma once
#include <string>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
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

// The tiles chosen for an arch.
struct VerifyTiles {
  int block_m = 64;   // rows (node x head) per CTA
  int block_n = 64;   // KV tokens per pipeline stage
  int warps = 4;
  int stages = 2;
  int smem_bytes = 0; // dynamic shared memory per CTA
  int warp_rows = 16; // rows per warp (16 or 32): 32 halves the B-operand loads per mma

  int warps_m() const { return block_m / warp_rows; }  // warp rows
  int warps_n() const { return warps / warps_m(); }     // column warps per warp row
};
VerifyTiles choose_verify_tiles(const VerifySpec& spec, const Arch& arch);

// Source with entry points "kdtree_verify_attention" and "kdtree_verify_combine".
KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
