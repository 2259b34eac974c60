#include "codegen/verify_attention.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/dtype_check.hpp"
#include "codegen/render.hpp"

namespace kdtree::codegen {
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
  for (const HeadShape& h : supported_heads()) {
    if (name == h.name || (h.mla && name == "mla")) {
      *head_dim_qk = h.head_dim_qk;
      *head_dim_v = h.head_dim_v;
      return;
    }
  }
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("head '{}' is not supported (use {})", name, head_names_text()));
}

std::string VerifySpec::head_name() const {
  return mla() ? fmt::format("mla{}/{}", head_dim_qk, head_dim_v) : fmt::format("gqa{}", head_dim_qk);
}

std::string VerifySpec::label() const {
  return fmt::format("verify_attention[{},W={},page={},{}]", head_name(), max_tree_nodes, page_size, dtype_name(dtype));
}

std::string VerifySpec::fast_key() const {
  return fmt::format("verify_attention/{}/{}/{}/{}/{}", head_dim_qk, head_dim_v, max_tree_nodes, page_size, int(dtype));
}

VerifySpec validate_verify_spec(const kdtree_verify_spec& s) {
  const kdtree_dtype dtype = checked_dtype(s.dtype, "dtype");  // before anything loads s.dtype
  const HeadShape* head = find_head(s.head_dim_qk, s.head_dim_v);
  if (!head) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("head_dim_qk/head_dim_v {}/{} is not supported (MLA 576/512, or GQA 64/64, 128/128, "
                     "256/256)",
                     s.head_dim_qk, s.head_dim_v));
  }
  if (!is_supported_tree_width(s.max_tree_nodes)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("max_tree_nodes {} is not supported ({})", s.max_tree_nodes, supported_widths_text()));
  }
  if (!is_supported_page_size(s.page_size)) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("page_size {} is not supported ({})", s.page_size, supported_page_sizes_text()));
  }
  const std::vector<kdtree_dtype>& dtypes = supported_attention_dtypes();
  if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("dtype {} is not supported for verify_attention (bf16 or f16)", dtype_name(dtype)));
  }
  require(s.num_q_heads >= 1 && s.num_q_heads <= 1024, "num_q_heads {} is out of range (1..1024)", s.num_q_heads);
  require(s.num_kv_heads >= 1, "num_kv_heads {} must be >= 1", s.num_kv_heads);
  require(s.num_q_heads % s.num_kv_heads == 0, "num_q_heads {} is not a multiple of num_kv_heads {}", s.num_q_heads,
          s.num_kv_heads);
  if (head->mla) {
    require(s.num_kv_heads == 1, "MLA has one latent KV head: num_kv_heads must be 1 (got {})", s.num_kv_heads);
  }
  VerifySpec v;
  v.head_dim_qk = s.head_dim_qk;
  v.head_dim_v = s.head_dim_v;
  v.page_size = s.page_size;
  v.max_tree_nodes = s.max_tree_nodes;
  v.dtype = dtype;
  return v;
}

VerifySmemLayout verify_smem_layout(const VerifySpec& spec, const VerifyTiles& t) {
  const int warps_n = t.warps_n();
  const int k_tile = t.block_n * spec.head_dim_qk * 2;
  const int v_tile = spec.mla() ? 0 : t.block_n * spec.head_dim_v * 2;  // MLA: V is the K row's head
  VerifySmemLayout l;
  if (t.qsplit) {
    l.k = 0;
    l.v = l.k + t.stages * k_tile;
    l.red = l.v + t.stages * v_tile;
    l.p = l.red + t.warps * t.warp_rows * t.block_n * 4;
    l.stats = l.p + t.block_m * t.block_n * 2;
    // Stats: per-row rescale factors, sums and maxima, then 128 bytes of segment walk.
    l.bytes = std::max(l.stats + 3 * t.block_m * 4 + 128, t.block_m * spec.head_dim_qk * 2);
    return l;
  }
  l.k = t.block_m * spec.head_dim_qk * 2;
  l.v = l.k + t.stages * k_tile;
  l.p = l.v + t.stages * v_tile;
  l.red = l.p + (warps_n > 1 ? t.block_m * t.block_n * 2 : 0);  // P only when a row spans warps
  l.stats = l.red + warps_n * t.block_m * 4;
  l.bytes = l.stats;
  return l;
}

namespace {

// One field of KDTREE_VERIFY_TILES: a decimal integer in [lo, hi] and nothing else.
int tiles_field(const std::string& text, const std::string& field, const char* name, int lo, int hi) {
  bool ok = !field.empty() && field.size() <= 9;
  for (char c : field) ok = ok && c >= '0' && c <= '9';
  const int v = ok ? std::stoi(field) : -1;
  if (!ok || v < lo || v > hi) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         fmt::format("KDTREE_VERIFY_TILES='{}': {} '{}' must be an integer in {}..{} (format "
                     "block_m,block_n,warps,stages[,warp_rows[,kernel]])",
                     text, name, field, lo, hi));
  }
  return v;
}

}  // namespace

VerifyTiles parse_verify_tiles(const std::string& text, const VerifySpec& spec, const Arch& arch) {
  std::vector<std::string> fields(1);
  for (char c : text) {
    if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back().push_back(c);
    }
  }
  auto bad = [&](const std::string& why) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("KDTREE_VERIFY_TILES='{}' for {}: {}", text, spec.label(), why));
  };
  if (fields.size() < 4 || fields.size() > 6) {
    bad(fmt::format("{} fields, expected block_m,block_n,warps,stages[,warp_rows[,kernel]]", fields.size()));
  }
  VerifyTiles t;
  t.block_m = tiles_field(text, fields[0], "block_m", 16, 256);
  t.block_n = tiles_field(text, fields[1], "block_n", 16, 256);
  t.warps = tiles_field(text, fields[2], "warps", 1, 32);
  t.stages = tiles_field(text, fields[3], "stages", 2, 8);
  if (fields.size() >= 5) t.warp_rows = tiles_field(text, fields[4], "warp_rows", 16, 32);
  if (fields.size() == 6) {
    if (fields[5] != "flash" && fields[5] != "qsplit") bad(fmt::format("kernel '{}' must be flash or qsplit", fields[5]));
    t.qsplit = fields[5] == "qsplit";
  }
  if (t.warp_rows != 16 && t.warp_rows != 32) bad("warp_rows must be 16 or 32");
  if (t.block_m % t.warp_rows) bad(fmt::format("block_m must be a multiple of warp_rows ({})", t.warp_rows));
  if (t.warps % t.warps_m()) {
    bad(fmt::format("warps must be a multiple of the {} warp rows (block_m / warp_rows)", t.warps_m()));
  }
  const int warps_n = t.warps_n();
  // A column warp's V slice keeps whole 8-chunk swizzle groups; its S columns whole n8 tiles.
  if (spec.head_dim_v % (64 * warps_n)) {
    bad(fmt::format("{} column warps do not divide head_dim_v {} into multiples of 64", warps_n, spec.head_dim_v));
  }
  if (t.block_n % 16 || (!t.qsplit && t.block_n % (8 * warps_n))) {  // qsplit: every warp has all columns
    bad(fmt::format("block_n must be a multiple of 16 and of 8 x {} column warps", warps_n));
  }
  if (t.qsplit && (!spec.mla() || t.block_n != 16 || t.warp_rows != 8 * warps_n || warps_n < 2 ||
                   spec.head_dim_qk % (16 * warps_n))) {
    // The template's row reduction: 16-token tiles, 8 rows per reducing warp.
    bad("the qsplit kernel is for MLA with block_n 16 and warp_rows = 8 x the column warps (e.g. 64,16,8,3,32)");
  }
  const int bytes = verify_smem_layout(spec, t).bytes;
  if (bytes > arch.max_smem_per_block) {
    bad(fmt::format("{} bytes of shared memory do not fit {} ({} per block)", bytes, arch.name(),
                    arch.max_smem_per_block));
  }
  return t;
}

VerifyTiles verify_tiles(const VerifySpec& spec, const Arch& arch) {
  const char* env = std::getenv("KDTREE_VERIFY_TILES");
  if (env && *env) return parse_verify_tiles(env, spec, arch);
  return choose_verify_tiles(spec, arch);
}

VerifyTiles choose_verify_tiles(const VerifySpec& spec, const Arch& arch) {
  // Candidates in order of preference; the first that fits the arch's shared memory wins.
  std::vector<VerifyTiles> candidates;
  // Fields: block_m, block_n, warps, stages, warp_rows.
  if (spec.mla()) {
    // MLA's 576-wide rows make Q and K tiles large: V columns are split over
    // column warps so the O accumulator (64 x 512 fp32 per CTA) fits in registers;
    // 32-row warps (2 x 4) read each V fragment for two m16 fragments.
    // Where a 64-row Q tile and 32-token stages do not fit (99 KB parts), Q moves to
    // registers (qsplit): still 64 rows and 2 x 4 warps, with 16-token stages, four
    // of them: its skewed warp rows keep the copies two tiles ahead only with four
    // (tools/perf_model, bench_verify's mla B=4 H=128 on the RTX PRO 6000 when this
    // was chosen: 1662 us against 1995 with three).
    candidates = {{64, 64, 8, 2, 32}, {64, 32, 8, 2, 32}, {64, 16, 8, 4, 32, true}, {64, 16, 8, 3, 32, true},
                  {32, 16, 4, 3, 16}};
  } else if (spec.head_dim_v <= 128) {
    // GQA: one column warp, P stays in registers. 32-row warps where the O slice
    // (32 x head_dim fp32) and S leave room without spills (gqa128: 32 KV tokens
    // per tile); deepest pipeline that fits.
    const int bn = spec.head_dim_v == 64 ? 64 : 32;
    candidates = {{128, bn, 4, 3, 32}, {128, bn, 4, 2, 32}, {64, 64, 4, 3, 16}, {64, 64, 4, 2, 16}};
  } else {
    // gqa256: a 32-row O slice over all 256 columns would not fit in registers;
    // two column warps (P through shared memory) take 128 columns each.
    candidates = {{128, 64, 8, 2, 32}, {64, 64, 4, 3, 16}, {64, 64, 4, 2, 16}, {64, 32, 4, 3, 16}, {64, 32, 4, 2, 16}};
  }
  for (const VerifyTiles& c : candidates) {
    const int bytes = verify_smem_layout(spec, c).bytes;
    if (bytes > arch.max_smem_per_block) continue;
    // One stage fewer where that fits a second CTA on the SM (gqa64 on the 100 KB
    // parts: 8 warps instead of 4 hide the latency a deeper pipeline would;
    // tools/perf_model predicts 191 -> 164 us for bench_verify's gqa64 on the RTX PRO 6000).
    VerifyTiles shallower = c;
    shallower.stages = c.stages - 1;
    const int shallower_bytes = verify_smem_layout(spec, shallower).bytes;
    auto per_sm = [&](int b) { return arch.max_smem_per_sm / (b + 1024); };
    if (shallower.stages >= 2 && per_sm(bytes) == 1 && per_sm(shallower_bytes) >= 2) return shallower;
    return c;
  }
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("{} does not fit {} ({} bytes of shared memory per block)", spec.label(),
                                             arch.name(), arch.max_smem_per_block));
}

KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch) {
  return generate_verify_attention(spec, arch, verify_tiles(spec, arch));
}

KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch, const VerifyTiles& tiles) {
  // One kernel family (mma.sync) for every supported arch: the arch shows in the
  // tiles. A second family (sm_90a wgmma) would be dispatched on it here.
  (void)arch;
  const VerifySmemLayout smem = verify_smem_layout(spec, tiles);
  const char* kernel_template = tiles.qsplit ? "verify_attention_qsplit" : "verify_attention";
  // The combine kernel: a row is head_dim_v / 4 threads (four columns each, 16-byte
  // loads), at most kCombineThreads; a CTA takes as many rows as fit.
  constexpr int kCombineThreads = 128;
  const int combine_row_threads = std::min(spec.head_dim_v / 4, kCombineThreads);
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
      {"SMEM_P", std::to_string(smem.p)},
      {"SMEM_RED", std::to_string(smem.red)},
      {"COMBINE_THREADS", std::to_string(kCombineThreads)},
      {"COMBINE_ROW_THREADS", std::to_string(combine_row_threads)},
  };
  if (tiles.qsplit) {
    params["SMEM_STATS"] = std::to_string(smem.stats);
  } else {
    params["SMEM_K"] = std::to_string(smem.k);
    params["SMEM_V"] = std::to_string(smem.v);
  }
  KernelSource src;
  src.op = "verify_attention";
  src.label = spec.label();
  src.file_stem = fmt::format(
      "verify_attention-{}-W{}-p{}-{}",
      spec.mla() ? fmt::format("mla{}x{}", spec.head_dim_qk, spec.head_dim_v) : fmt::format("gqa{}", spec.head_dim_qk),
      spec.max_tree_nodes, spec.page_size, dtype_name(spec.dtype));
  set_template_source(src, kernel_template, params, {"verify_attention_params.h", "verify_attention_common.cuh"});
  src.entry_points = {"kdtree_verify_attention", "kdtree_verify_combine"};
  if (tiles.qsplit) src.entry_points.push_back("kdtree_verify_combine_stream");
  src.launch.threads = tiles.warps * 32;
  src.launch.dynamic_smem = smem.bytes;
  src.launch.block_m = tiles.block_m;
  src.launch.block_n = tiles.block_n;
  src.launch.combine_threads = kCombineThreads;
  src.launch.combine_rows = kCombineThreads / combine_row_threads;
  src.launch.stream_k = tiles.qsplit;  // templates/verify_attention_qsplit.cu walks stream-K segments
  return src;
}

}  // namespace kdtree::codegen
