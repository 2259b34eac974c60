#include "codegen/verify_attention.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "codegen/render.hpp"
#include "codegen/template_store.hpp"
#include "base/error.hpp"

namespace kdtree::codegen {
namespace {

constexpr int kWidths[] = {16, 32, 64, 128};
constexpr int kPageSizes[] = {1, 16, 32, 64, 128};

template <size_t N>
bool contains(const int (&values)[N], int v) {
  return std::find(std::begin(values), std::end(values), v) != std::end(values);
}

}  // namespace

const char* dtype_name(kdtree_dtype dtype) {
  switch (dtype) {
    case KDTREE_DTYPE_BF16: return "bf16";
    case KDTREE_DTYPE_F16: return "f16";
    case KDTREE_DTYPE_F32: return "f32";
  }
  return "unknown";
}

kdtree_dtype parse_dtype(const std::string& name) {
  if (name == "bf16") return KDTREE_DTYPE_BF16;
  if (name == "f16" || name == "fp16") return KDTREE_DTYPE_F16;
  if (name == "f32" || name == "fp32") return KDTREE_DTYPE_F32;
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("dtype '{}' is not supported (use bf16, f16 or f32)", name));
}

void parse_head_name(const std::string& name, int* head_dim_qk, int* head_dim_v) {
  if (name == "mla576/512" || name == "mla") {
    *head_dim_qk = 576;
    *head_dim_v = 512;
    return;
  }
  for (int d : {64, 128, 256}) {
    if (name == fmt::format("gqa{}", d)) {
      *head_dim_qk = *head_dim_v = d;
      return;
    }
  }
  fail(KDTREE_ERROR_UNSUPPORTED,
       fmt::format("head '{}' is not supported (use mla576/512, gqa64, gqa128 or gqa256)", name));
}

std::string VerifySpec::head_name() const {
  return mla() ? fmt::format("mla{}/{}", head_dim_qk, head_dim_v) : fmt::format("gqa{}", head_dim_qk);
}

std::string VerifySpec::label() const {
  return fmt::format("verify_attention[{},W={},page={},{}]", head_name(), max_tree_nodes, page_size,
                     dtype_name(dtype));
}

std::string VerifySpec::fast_key() const {
  return fmt::format("verify_attention/{}/{}/{}/{}/{}", head_dim_qk, head_dim_v, max_tree_nodes, page_size,
                     int(dtype));
}

VerifySpec validate_verify_spec(const kdtree_verify_spec& s) {
  bool mla = s.head_dim_qk == 576 && s.head_dim_v == 512;
  bool gqa = s.head_dim_qk == s.head_dim_v && (s.head_dim_qk == 64 || s.head_dim_qk == 128 || s.head_dim_qk == 256);
  if (!mla && !gqa) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("head_dim_qk/head_dim_v {}/{} is not supported (MLA 576/512, or GQA 64/64, 128/128, "
                     "256/256)",
                     s.head_dim_qk, s.head_dim_v));
  }
  if (!contains(kWidths, s.max_tree_nodes)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("max_tree_nodes {} is not supported (16, 32, 64 or 128)", s.max_tree_nodes));
  }
  if (!contains(kPageSizes, s.page_size)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("page_size {} is not supported (1, 16, 32, 64 or 128)", s.page_size));
  }
  if (s.dtype != KDTREE_DTYPE_BF16 && s.dtype != KDTREE_DTYPE_F16) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("dtype {} is not supported for verify_attention (bf16 or f16)", dtype_name(s.dtype)));
  }
  require(s.num_q_heads >= 1 && s.num_q_heads <= 1024, "num_q_heads {} is out of range (1..1024)", s.num_q_heads);
  require(s.num_kv_heads >= 1, "num_kv_heads {} must be >= 1", s.num_kv_heads);
  require(s.num_q_heads % s.num_kv_heads == 0, "num_q_heads {} is not a multiple of num_kv_heads {}", s.num_q_heads, s.num_kv_heads);
  if (mla) {
    require(s.num_kv_heads == 1, "MLA has one latent KV head: num_kv_heads must be 1 (got {})",
                                             s.num_kv_heads);
  }
  VerifySpec v;
  v.head_dim_qk = s.head_dim_qk;
  v.head_dim_v = s.head_dim_v;
  v.page_size = s.page_size;
  v.max_tree_nodes = s.max_tree_nodes;
  v.dtype = s.dtype;
  return v;
}

namespace {

int verify_smem_bytes(const VerifySpec& spec, const VerifyTiles& t) {
  const int warps_n = t.warps_n();
  int q = t.block_m * spec.head_dim_qk * 2;
  int kv = t.block_n * (spec.head_dim_qk + (spec.mla() ? 0 : spec.head_dim_v)) * 2;
  int p = warps_n > 1 ? t.block_m * t.block_n * 2 : 0;
  int red = warps_n * t.block_m * 4;
  return q + t.stages * kv + p + red;
}

// KDTREE_VERIFY_TILES="block_m,block_n,warps,stages[,warp_rows]" overrides the choice
// (tuning only).
bool tiles_from_env(const VerifySpec& spec, const Arch& arch, VerifyTiles* t) {
  const char* env = std::getenv("KDTREE_VERIFY_TILES");
  if (!env || !*env) return false;
  VerifyTiles c;
  int fields = std::sscanf(env, "%d,%d,%d,%d,%d", &c.block_m, &c.block_n, &c.warps, &c.stages, &c.warp_rows);
  const bool rows_ok = (c.warp_rows == 16 || c.warp_rows == 32) && c.block_m >= c.warp_rows && c.block_m % c.warp_rows == 0;
  const int warps_n = rows_ok && c.warps % c.warps_m() == 0 ? c.warps_n() : 0;
  // A column warp's V slice must keep whole 8-chunk swizzle groups (head_dim_v / warps_n % 64 == 0).
  if (fields < 4 || warps_n < 1 || spec.head_dim_v % (64 * warps_n) || c.block_n % 16 || c.block_n % (8 * warps_n) ||
      c.stages < 2) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         fmt::format("KDTREE_VERIFY_TILES='{}' is not block_m,block_n,warps,stages[,warp_rows]", env));
  }
  c.smem_bytes = verify_smem_bytes(spec, c);
  if (c.smem_bytes > arch.max_smem_per_block) return false;
  *t = c;
  return true;
}

}  // namespace

VerifyTiles choose_verify_tiles(const VerifySpec& spec, const Arch& arch) {
  VerifyTiles chosen;
  if (tiles_from_env(spec, arch, &chosen)) return chosen;
  // Candidates in order of preference; the first that fits the arch's shared memory wins.
  std::vector<VerifyTiles> candidates;
  // Fields: block_m, block_n, warps, stages, smem (computed), warp_rows.
  if (spec.mla()) {
    // MLA's 576-wide rows make Q and K tiles large: V columns are split over
    // column warps so the O accumulator (64 x 512 fp32 per CTA) fits in registers;
    // 32-row warps (2 x 4) read each V fragment for two m16 fragments.
    candidates = {{64, 64, 8, 2, 0, 32}, {64, 32, 8, 2, 0, 32}, {32, 16, 4, 3, 0, 16},
                  {32, 16, 4, 2, 0, 16}};
  } else if (spec.head_dim_v <= 128) {
    // GQA: one column warp, P stays in registers. 32-row warps where the O slice
    // (32 x head_dim fp32) and S leave room without spills (gqa128: 32 KV tokens
    // per tile); deepest pipeline that fits.
    const int bn = spec.head_dim_v == 64 ? 64 : 32;
    candidates = {{128, bn, 4, 3, 0, 32}, {128, bn, 4, 2, 0, 32}, {64, 64, 4, 3, 0, 16},
                  {64, 64, 4, 2, 0, 16}};
  } else {
    // gqa256: a 32-row O slice over all 256 columns would not fit in registers;
    // two column warps (P through shared memory) take 128 columns each.
    candidates = {{128, 64, 8, 2, 0, 32}, {64, 64, 4, 3, 0, 16}, {64, 64, 4, 2, 0, 16},
                  {64, 32, 4, 3, 0, 16}, {64, 32, 4, 2, 0, 16}};
  }
  for (VerifyTiles c : candidates) {
    c.smem_bytes = verify_smem_bytes(spec, c);
    if (c.smem_bytes <= arch.max_smem_per_block) return c;
  }
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("{} does not fit {} ({} bytes of shared memory per block)",
                                             spec.label(), arch.name(), arch.max_smem_per_block));
}

KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch) {
  const VerifyTiles tiles = choose_verify_tiles(spec, arch);
  Params params = {
      {"HEAD_DIM_QK", std::to_string(spec.head_dim_qk)},
      {"HEAD_DIM_V", std::to_string(spec.head_dim_v)},
      {"PAGE_SIZE", std::to_string(spec.page_size)},
      {"MAX_TREE_NODES", std::to_string(spec.max_tree_nodes)},
      {"IS_MLA", spec.mla() ? "true" : "false"},
      {"IS_BF16", spec.dtype == KDTREE_DTYPE_BF16 ? "true" : "false"},
      {"BLOCK_M", std::to_string(tiles.block_m)},
      {"BLOCK_N", std::to_string(tiles.block_n)},
      {"WARPS_M", std::to_string(tiles.warps_m())},
      {"WARPS_N", std::to_string(tiles.warps_n())},
      {"WARP_ROWS", std::to_string(tiles.warp_rows)},
      {"STAGES", std::to_string(tiles.stages)},
  };
  KernelSource src;
  src.op = "verify_attention";
  src.label = spec.label();
  src.file_stem = fmt::format("verify_attention-{}-W{}-p{}-{}",
                              spec.mla() ? fmt::format("mla{}x{}", spec.head_dim_qk, spec.head_dim_v)
                                         : fmt::format("gqa{}", spec.head_dim_qk),
                              spec.max_tree_nodes, spec.page_size, dtype_name(spec.dtype));
  src.source = template_text("common.cuh") + template_text("verify_attention_params.h") +
               render("verify_attention.cu", template_text("verify_attention.cu"), params);
  src.entry_points = {"kdtree_verify_attention", "kdtree_verify_combine"};
  return src;
}

}  // namespace kdtree::codegen
