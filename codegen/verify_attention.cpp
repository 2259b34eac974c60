#include "codegen/verify_attention.hpp"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/dtype_check.hpp"
#include "codegen/render.hpp"
#include "verify_attention_layout.h"

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
  return fmt::format("verify_attention[{},W={},page={},{}{}]", head_name(), max_tree_nodes, page_size,
                     dtype_name(dtype), kv_fp8() ? ",kv=e4m3" : "");
}

std::string VerifySpec::fast_key() const {
  return fmt::format("verify_attention/{}/{}/{}/{}/{}/{}", head_dim_qk, head_dim_v, max_tree_nodes, page_size,
                     int(dtype), int(kv_dtype));
}

const char* kv_dtype_name(kdtree_kv_dtype kv_dtype) {
  switch (kv_dtype) {
    case KDTREE_KV_DTYPE_AS_Q: return "as_q";
    case KDTREE_KV_DTYPE_E4M3: return "e4m3";
  }
  return "unknown";
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
  v.kv_dtype = checked_kv_dtype(s.kv_dtype, "kv_dtype");  // its bytes: C callers can store any int
  v.head_dim_qk = s.head_dim_qk;
  v.head_dim_v = s.head_dim_v;
  v.page_size = s.page_size;
  v.max_tree_nodes = s.max_tree_nodes;
  v.dtype = dtype;
  return v;
}

const char* kernel_name(VerifyKernel kernel) {
  switch (kernel) {
    case VerifyKernel::flash: return "flash";
    case VerifyKernel::qsplit: return "qsplit";
    case VerifyKernel::wgmma: return "wgmma";
  }
  return "unknown";
}

bool parse_kernel_name(const std::string& name, VerifyKernel* kernel) {
  for (VerifyKernel k : {VerifyKernel::flash, VerifyKernel::qsplit, VerifyKernel::wgmma}) {
    if (name == kernel_name(k)) {
      *kernel = k;
      return true;
    }
  }
  return false;
}

std::string VerifyTiles::str() const {
  return fmt::format("kernel={},block_m={},block_n={},warps={},stages={},warp_rows={}{}", kernel_name(kernel), block_m,
                     block_n, warps, stages, warp_rows, mma_e4m3 ? ",mma=e4m3" : "");
}

std::string FlashSmemLayout::str() const {
  return fmt::format("q={},q_scale={},k={},v={},p={},red={},bytes={}", q, q_scale, k, v, p, red, bytes);
}

std::string WgmmaSmemLayout::str() const {
  return fmt::format("q={},p1={},k={},v={},p={},red={},scale={},bar={},rows={},walk={},raw={},raw_stages={},bytes={}",
                     q, p1, k, v, p, red, scale, bar, rows, walk, raw, raw_stages, bytes);
}

std::string QsplitSmemLayout::str() const {
  return fmt::format("k={},part_s={},p={},stats={},q_scale={},walk={},bytes={}", k, part_s, p, stats, q_scale, walk,
                     bytes);
}

namespace {

// The qsplit kernel's e4m3 MMA path keeps MLA's 36-chunk e4m3 rows unpadded (its
// fourth KV stage needs those 64 bytes a row; templates' KV_ROWS_PACKED).
bool kv_rows_packed(const VerifyTiles& t) { return t.kernel == VerifyKernel::qsplit && t.mma_e4m3; }

// A cached row in shared memory, in 16-byte chunks: a row longer than one 8-chunk
// swizzle group is padded to whole groups (MLA e4m3: 36 -> 40; templates'
// kv_row_stride), unless packed.
int kv_row_chunks(const VerifySpec& spec, const VerifyTiles& t, int head_dim) {
  const int chunks = head_dim * spec.kv_bytes() / 16;
  return chunks > 8 && !kv_rows_packed(t) ? (chunks + 7) / 8 * 8 : chunks;
}
int k_tile_bytes(const VerifySpec& spec, const VerifyTiles& t) {
  return t.block_n * kv_row_chunks(spec, t, spec.head_dim_qk) * 16;
}
// MLA: V is the K row's first head_dim_v dims, no stages of its own.
int v_tile_bytes(const VerifySpec& spec, const VerifyTiles& t) {
  return spec.mla() ? 0 : t.block_n * kv_row_chunks(spec, t, spec.head_dim_v) * 16;
}

}  // namespace

FlashSmemLayout flash_smem_layout(const VerifySpec& spec, const VerifyTiles& t) {
  FlashSmemLayout l;
  l.q = 0;
  // The e4m3 MMA path stages Q as e4m3 codes in rows like the cache's, with a scale per row.
  const int q_row_bytes = t.mma_e4m3 ? kv_row_chunks(spec, t, spec.head_dim_qk) * 16 : spec.head_dim_qk * 2;
  l.q_scale = t.block_m * q_row_bytes;
  l.k = l.q_scale + (t.mma_e4m3 ? t.block_m * 4 : 0);
  l.v = l.k + t.stages * k_tile_bytes(spec, t);
  l.p = l.v + t.stages * v_tile_bytes(spec, t);
  const int p_elem_bytes = t.mma_e4m3 ? 1 : 2;
  l.red = l.p + (t.warps_n() > 1 ? t.block_m * t.block_n * p_elem_bytes : 0);  // P only when a row spans warps
  l.bytes = l.red + t.warps_n() * t.block_m * 4;
  return l;
}

QsplitSmemLayout qsplit_smem_layout(const VerifySpec& spec, const VerifyTiles& t) {
  QsplitSmemLayout l;
  l.k = 0;
  l.part_s = l.k + t.stages * (k_tile_bytes(spec, t) + v_tile_bytes(spec, t));
  // Partial S: a warp's whole tile (16-bit MMA), or on the e4m3 MMA path the three of
  // its four 8-row quarters that other warps reduce (block_n / 4 floats a lane each).
  const int part_warp_bytes = t.mma_e4m3 ? (t.warps_n() - 1) * 32 * t.block_n : t.warp_rows * t.block_n * 4;
  l.p = l.part_s + t.warps * part_warp_bytes;
  l.stats = l.p + t.block_m * t.block_n * (t.mma_e4m3 ? 1 : 2);  // P: e4m3 codes on the e4m3 MMA path
  // Q is staged from offset 0 before each segment's loop, over the K stages and (e4m3 caches: smaller
  // stages) the exchanges and stats, which hold nothing then: 16-bit rows, or on the e4m3 MMA path
  // e4m3 rows as the cache's and a scale per row after them (q_scale). The segment walk is live
  // across it, so it starts past both.
  const int q_row_bytes = t.mma_e4m3 ? kv_row_chunks(spec, t, spec.head_dim_qk) * 16 : spec.head_dim_qk * 2;
  l.q_scale = t.block_m * q_row_bytes;
  const int q_bytes = l.q_scale + (t.mma_e4m3 ? t.block_m * 4 : 0);
  l.walk = std::max(l.stats + KDTREE_QSPLIT_STATS * t.block_m * 4, q_bytes);
  l.bytes = l.walk + KDTREE_SEGMENT_WALK_BYTES;
  return l;
}

WgmmaSmemLayout wgmma_smem_layout(const VerifySpec& spec, const VerifyTiles& t) {
  WgmmaSmemLayout l;
  l.q = 0;
  if (!spec.mla()) {
    const int tile = t.block_n * spec.head_dim_qk * 2;  // 16-bit K or V rows
    l.k = t.block_m * spec.head_dim_qk * 2;
    l.v = l.k + t.stages * tile;
    const int bar_bytes = 4 * t.stages * 8;  // K and V full/empty mbarriers; one segment a CTA: no walk
    l.raw = l.v + t.stages * tile;
    l.bar = l.raw;
    if (spec.kv_fp8()) {
      // e4m3 caches: a tile's K and V rows as the cache holds them (cp.async lands them there, the
      // producer dequantises them into a stage), two tiles ahead where they fit, else one.
      const int raw_tile = 2 * t.block_n * spec.head_dim_qk;
      const int room = (arch_from_sm(90).max_smem_per_block - l.raw - bar_bytes) / raw_tile;
      l.raw_stages = std::max(1, std::min(2, room));
      l.bar = l.raw + l.raw_stages * raw_tile;
    }
    l.bytes = l.bar + bar_bytes;
    return l;
  }
  if (t.mma_e4m3) {
    // e4m3 codes: Q's latent dims, the K slots (5 column blocks of 128-byte rows: 576 bytes padded
    // to 640), both P tiles (a row's 64 codes in a 128-byte swizzled row), then the row exchange
    // and the scales ([2][block_m] rescale factors, [block_m] Q row scales).
    l.k = t.block_m * spec.head_dim_v;
    l.p = l.k + t.stages * k_tile_bytes(spec, t);
    l.p1 = l.p + t.block_m * 128;
    l.red = l.p1 + t.block_m * 128;
    l.scale = l.red + 2 * t.block_m * 4;
    l.bar = l.scale + 3 * t.block_m * 4;
  } else {
    l.p1 = t.block_m * spec.head_dim_v * 2;
    l.k = l.p1 + t.block_m * t.block_n * 2;
    l.p = l.k + t.stages * k_tile_bytes(spec, t);
    l.red = l.p + t.block_m * t.block_n * 2;
    l.bar = l.red + 2 * t.block_m * 4;
  }
  l.rows = l.bar + t.stages * 3 * 8;
  l.walk = l.rows + t.stages * t.block_n * 4;
  l.bytes = l.walk + KDTREE_SEGMENT_WALK_BYTES;
  return l;
}

int verify_smem_bytes(const VerifySpec& spec, const VerifyTiles& tiles) {
  switch (tiles.kernel) {
    case VerifyKernel::flash: return flash_smem_layout(spec, tiles).bytes;
    case VerifyKernel::qsplit: return qsplit_smem_layout(spec, tiles).bytes;
    case VerifyKernel::wgmma: return wgmma_smem_layout(spec, tiles).bytes;
  }
  fail(KDTREE_ERROR_INTERNAL, "verify_smem_bytes: unknown kernel family");
}

namespace {

constexpr const char* kTileKeys[] = {"kernel", "block_m", "block_n", "warps", "stages", "warp_rows", "mma"};

// One integer value of KDTREE_VERIFY_TILES: decimal digits only, in [lo, hi].
int tiles_int(const std::string& text, const std::string& key, const std::string& value, int lo, int hi) {
  bool ok = !value.empty() && value.size() <= 9;
  for (char c : value) ok = ok && c >= '0' && c <= '9';
  const int v = ok ? std::stoi(value) : -1;
  if (!ok || v < lo || v > hi) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         fmt::format("KDTREE_VERIFY_TILES='{}': {} '{}' must be an integer in {}..{}", text, key, value, lo, hi));
  }
  return v;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> fields(1);
  for (char c : text) {
    if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back().push_back(c);
    }
  }
  return fields;
}

// The key=value spelling of the removed positional form
// block_m,block_n,warps,stages[,warp_rows[,kernel]], for the error message.
std::string positional_to_keys(const std::vector<std::string>& fields) {
  std::string keys;
  for (std::size_t i = 0; i < fields.size() && i < 6; ++i) {
    const int key = i == 5 ? 0 : int(i) + 1;  // the kernel came last
    keys += fmt::format("{}{}={}", keys.empty() ? "" : ",", kTileKeys[key], fields[i]);
  }
  return keys;
}

// The wgmma family's one tiling for the spec's cache: 16-bit, two K slots (one pair of tiles);
// e4m3 (mma=e4m3), four: its slots are half the size, so two pairs are in flight.
// GQA (templates/verify_attention_wgmma_gqa.cu): 128 rows (a warpgroup's 64 each, the
// producer warpgroup beyond `warps`), 128-token tiles (64 for 256-dim heads, whose O takes
// 128 registers) in as many stages as fit beside Q (gqa64: 4 of the 6 that fit); over e4m3
// caches (dequantised by the producer, 16-bit MMAs) gqa128 keeps 2 to leave room for the
// cache bytes in flight (2 and 3 ran alike over 16-bit caches on the H200).
VerifyTiles wgmma_tiles(const VerifySpec& spec) {
  if (!spec.mla()) {
    const int d = spec.head_dim_qk;
    const int stages = d == 64 ? 4 : d == 128 && !spec.kv_fp8() ? 3 : 2;
    return {VerifyKernel::wgmma, 128, d == 256 ? 64 : 128, 8, stages, 16, false};
  }
  return {VerifyKernel::wgmma, 64, 64, 8, spec.kv_fp8() ? 4 : 2, 16, spec.kv_fp8()};
}

// The rules of each family's template (see VerifyKernel and parse_verify_tiles).
void check_tiles(const VerifyTiles& t, const VerifySpec& spec, const Arch& arch,
                 const std::function<void(const std::string&)>& bad) {
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
  if (t.mma_e4m3) {
    if (!spec.kv_fp8()) bad("mma=e4m3 reads e4m3 caches: kv_dtype is not e4m3 (16-bit caches take mma=16bit)");
    if (t.block_n % 32) bad("mma=e4m3 steps 32 tokens: block_n must be a multiple of 32");
    if (arch.sm < 89) bad(fmt::format("mma=e4m3 needs e4m3 tensor cores (sm_89 and newer), not {}", arch.name()));
  }
  switch (t.kernel) {
    case VerifyKernel::flash:
      if (t.block_n % 16 || t.block_n % (8 * warps_n)) {
        bad(fmt::format("block_n must be a multiple of 16 and of 8 x {} column warps", warps_n));
      }
      break;
    case VerifyKernel::qsplit:  // every warp has all columns; the row reduction takes 8 rows of 16-token tiles
      if (t.mma_e4m3) {
        // A 32-token tile of 2 warp rows (SKEW) x 4 column warps of 32 rows: each column warp reduces one
        // 8-row quarter of its warp row and takes 4 latent k32 steps and one of the 4 (rope step, m16
        // fragment) pairs; the copies run stages - 2 tiles ahead.
        if (!spec.mla() || t.block_n != 32 || t.warp_rows != 32 || t.warps_m() != 2 || warps_n != 4 || t.stages < 3) {
          bad("the qsplit kernel's mma=e4m3 path is for MLA with block_n 32, warp_rows 32, 2 warp rows of 4 "
              "column warps and stages >= 3 (kernel=qsplit,block_m=64,block_n=32,warps=8,stages=3,warp_rows=32,"
              "mma=e4m3)");
        }
      } else if (!spec.mla() || t.block_n != 16 || t.warp_rows != 8 * warps_n || warps_n < 2 ||
                 spec.head_dim_qk % (16 * warps_n)) {
        bad("the qsplit kernel is for MLA with block_n 16 and warp_rows = 8 x the column warps "
            "(e.g. kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32)");
      }
      break;
    case VerifyKernel::wgmma:  // one shape: two warpgroups over 64 rows, the MMA shapes of templates/wgmma.cuh
      if (arch.sm != 90) bad(fmt::format("the wgmma kernel needs sm_90 (wgmma is sm_90a only), not {}", arch.name()));
      if (!spec.mla()) {
        const VerifyTiles g = wgmma_tiles(spec);
        // One tiling; the stages may be fewer (tuning).
        if (t.block_m != g.block_m || t.block_n != g.block_n || t.warps != g.warps || t.stages > g.stages ||
            t.warp_rows != g.warp_rows || t.mma_e4m3) {
          bad(fmt::format("the GQA wgmma kernel has one tiling for head dim {}: {} (stages 2 to {})", spec.head_dim_qk,
                          g.str(), g.stages));
        }
        break;
      }
      // 16-bit caches on bf16/f16 wgmma; e4m3 caches on the native e4m3 wgmma (mma=e4m3).
      if (spec.kv_fp8() != t.mma_e4m3) {
        bad(spec.kv_fp8() ? "the wgmma kernel reads e4m3 caches with mma=e4m3 (native e4m3 wgmma; the dequantising "
                            "path is kernel=flash)"
                          : "the wgmma kernel reads 16-bit caches with mma=16bit");
      }
      // Two slots a pair of tiles; e4m3's smaller slots leave room for a second pair in flight.
      if (t.block_m != 64 || t.block_n != 64 || t.warps != 8 || t.warp_rows != 16 ||
          (t.mma_e4m3 ? t.stages != 2 && t.stages != 4 : t.stages != 2)) {
        bad(t.mma_e4m3 ? "the wgmma kernel over e4m3 caches has one tiling: kernel=wgmma,block_m=64,block_n=64,"
                         "warps=8,stages=4,warp_rows=16,mma=e4m3 (stages 2: one pair in flight)"
                       : "the wgmma kernel has one tiling: kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,"
                         "warp_rows=16");
      }
      break;
  }
  const int bytes = verify_smem_bytes(spec, t);
  if (bytes > arch.max_smem_per_block) {
    bad(fmt::format("{} bytes of shared memory do not fit {} ({} per block)", bytes, arch.name(),
                    arch.max_smem_per_block));
  }
}

}  // namespace

namespace {
VerifyTiles choose_tiles(const VerifySpec& spec, const Arch& arch, bool gqa_wgmma);
}  // namespace

VerifyTiles parse_verify_tiles(const std::string& text, const VerifySpec& spec, const Arch& arch) {
  auto bad = [&](const std::string& why) {
    fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("KDTREE_VERIFY_TILES='{}' for {}: {}", text, spec.label(), why));
  };
  const std::vector<std::string> fields = split_commas(text);
  if (text.find('=') == std::string::npos) {
    bad(
        fmt::format("the positional form is gone: write key=value pairs, e.g. {} (keys kernel, block_m, block_n, "
                    "warps, stages, warp_rows, mma)",
                    positional_to_keys(fields)));
  }
  // Keys left out keep the generator's choice, or with kernel=wgmma that family's one tiling.
  VerifyTiles t = choose_verify_tiles(spec, arch);
  if (std::find(fields.begin(), fields.end(), "kernel=wgmma") != fields.end()) {
    t = wgmma_tiles(spec);
  }
  // mma=e4m3 without a kernel, where the generator's GQA kernel is the wgmma one (16-bit MMAs only): the
  // portable families' choice takes it.
  // (A key given twice is an error below, so this is also whether `kernel` was given.)
  const bool kernel_given =
      std::any_of(fields.begin(), fields.end(), [](const std::string& f) { return f.rfind("kernel=", 0) == 0; });
  if (!kernel_given && t.kernel == VerifyKernel::wgmma && !spec.mla() &&
      std::find(fields.begin(), fields.end(), "mma=e4m3") != fields.end()) {
    t = choose_tiles(spec, arch, false);
  }
  std::vector<std::string> seen;
  for (const std::string& field : fields) {
    const std::size_t eq = field.find('=');
    const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    if (eq == std::string::npos || key.empty()) bad(fmt::format("'{}' is not key=value", field));
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) bad(fmt::format("{} is given twice", key));
    seen.push_back(key);
    if (key == "kernel") {
      if (!parse_kernel_name(value, &t.kernel)) bad(fmt::format("kernel '{}' must be flash, qsplit or wgmma", value));
    } else if (key == "block_m") {
      t.block_m = tiles_int(text, key, value, 16, 256);
    } else if (key == "block_n") {
      t.block_n = tiles_int(text, key, value, 16, 256);
    } else if (key == "warps") {
      t.warps = tiles_int(text, key, value, 1, 32);
    } else if (key == "stages") {
      t.stages = tiles_int(text, key, value, 2, 8);
    } else if (key == "warp_rows") {
      t.warp_rows = tiles_int(text, key, value, 16, 32);
    } else if (key == "mma") {
      if (value != "16bit" && value != "e4m3") bad(fmt::format("mma '{}' must be 16bit or e4m3", value));
      t.mma_e4m3 = value == "e4m3";
    } else {
      bad(fmt::format("unknown key '{}' (keys: kernel, block_m, block_n, warps, stages, warp_rows, mma)", key));
    }
  }
  // A family other than the generator's, its mma left out: the form the generator gives that family here
  // (sm_90 e4m3 caches: the wgmma kernel's is e4m3, flash's and qsplit's dequantise).
  const bool mma_given = std::find(seen.begin(), seen.end(), "mma") != seen.end();
  if (kernel_given && !mma_given && t.kernel != choose_verify_tiles(spec, arch).kernel) {
    t.mma_e4m3 = spec.kv_fp8() && ((t.kernel == VerifyKernel::wgmma && spec.mla()) || prefers_e4m3_mma(arch));
  }
  check_tiles(t, spec, arch, bad);
  return t;
}

VerifyTiles verify_tiles(const VerifySpec& spec, const Arch& arch) {
  const char* env = std::getenv("KDTREE_VERIFY_TILES");
  if (env && *env) return parse_verify_tiles(env, spec, arch);
  return choose_verify_tiles(spec, arch);
}

bool prefers_e4m3_mma(const Arch& arch) { return has_block_scaled_e4m3_mma(arch); }

namespace {

// sm_120/sm_121's tiles for gqa256 (either cache type; e4m3: the e4m3 MMA path): 8 warps of 16 rows,
// tools/perf_model's best on sm_120a for bench_verify's gqa256 shape (B=4 g=8 n=64 8K) at the measured
// tensor rate, and validated at these tiles on the H200 (predicted against measured within 2%). gqa64's and
// gqa128's best tiles in the model were not (18-38% optimistic on the H200), so those keep choose_tiles'
// candidates (docs/PERFORMANCE.md, "sm_120: GQA tiles at the measured tensor rate").
std::optional<VerifyTiles> sm120_gqa_tiles(const VerifySpec& spec, const Arch& arch) {
  constexpr VerifyKernel flash = VerifyKernel::flash;
  if (!has_block_scaled_e4m3_mma(arch) || spec.mla() || spec.head_dim_v != 256) return std::nullopt;
  if (spec.kv_fp8()) return VerifyTiles{flash, 128, 32, 8, 3, 16, true};
  return VerifyTiles{flash, 128, 16, 8, 2, 16};
}

// choose_verify_tiles, or with gqa_wgmma false the portable families' choice for GQA on sm_90.
VerifyTiles choose_tiles(const VerifySpec& spec, const Arch& arch, bool gqa_wgmma) {
  // sm_120/sm_121, gqa256: taken as they are.
  const std::optional<VerifyTiles> tuned = sm120_gqa_tiles(spec, arch);
  if (tuned && verify_smem_bytes(spec, *tuned) <= arch.max_smem_per_block) return *tuned;
  // Candidates in order of preference; the first that fits the arch's shared memory wins.
  std::vector<VerifyTiles> candidates;
  constexpr VerifyKernel flash = VerifyKernel::flash, qsplit = VerifyKernel::qsplit;
  // Fields: kernel, block_m, block_n, warps, stages, warp_rows.
  if (spec.mla() && arch.sm == 90) {
    // Hopper: warpgroup MMAs read Q, K and P from shared memory by descriptor; mma.sync
    // is capped there by ldmatrix's shared-memory traffic. H200: 1.2-1.8x the flash
    // kernel on bench_verify's MLA shapes (docs/PERFORMANCE.md). e4m3 caches on the
    // native e4m3 wgmma (mma=e4m3), where mma.sync's e4m3 is emulated with f16 MMAs.
    candidates = {wgmma_tiles(spec), {flash, 64, 64, 8, 2, 32}};
  } else if (spec.mla()) {
    // MLA's 576-wide rows make Q and K tiles large: V columns are split over
    // column warps so the O accumulator (64 x 512 fp32 per CTA) fits in registers;
    // 32-row warps (2 x 4) read each V fragment for two m16 fragments.
    // Where a 64-row Q tile and 32-token stages do not fit (99 KB parts), Q moves to
    // registers (qsplit): still 64 rows and 2 x 4 warps, with 16-token stages, four
    // of them: its skewed warp rows keep the copies two tiles ahead only with four
    // (tools/perf_model, bench_verify's mla B=4 H=128 on the RTX PRO 6000 when this
    // was chosen: 1662 us against 1995 with three).
    candidates = {{flash, 64, 64, 8, 2, 32},
                  {flash, 64, 32, 8, 2, 32},
                  {qsplit, 64, 16, 8, 4, 32},
                  {qsplit, 64, 16, 8, 3, 32},
                  {flash, 32, 16, 4, 3, 16}};
  } else if (spec.head_dim_v <= 128) {
    // GQA: one column warp, P stays in registers. 32-row warps where the O slice
    // (32 x head_dim fp32) and S leave room without spills (gqa128: 32 KV tokens
    // per tile); deepest pipeline that fits.
    const int bn = spec.head_dim_v == 64 ? 64 : 32;
    candidates = {
        {flash, 128, bn, 4, 3, 32}, {flash, 128, bn, 4, 2, 32}, {flash, 64, 64, 4, 3, 16}, {flash, 64, 64, 4, 2, 16}};
  } else {
    // gqa256: a 32-row O slice over all 256 columns would not fit in registers;
    // two column warps (P through shared memory) take 128 columns each.
    candidates = {{flash, 128, 64, 8, 2, 32},
                  {flash, 64, 64, 4, 3, 16},
                  {flash, 64, 64, 4, 2, 16},
                  {flash, 64, 32, 4, 3, 16},
                  {flash, 64, 32, 4, 2, 16}};
  }
  // Hopper, GQA: the wgmma family's GQA kernel, its producer dequantising e4m3 caches (H200:
  // 1.9-2.6x the flash kernel on bench_verify's GQA shapes over 16-bit caches, docs/PERFORMANCE.md).
  if (!spec.mla() && arch.sm == 90 && gqa_wgmma) candidates.insert(candidates.begin(), wgmma_tiles(spec));
  // e4m3 caches where mma.sync takes e4m3 natively (sm_120/sm_121, block-scaled at
  // twice the bf16 rate; elsewhere ptxas emulates it with f16 MMAs): Q and P
  // quantised, QK and PV on e4m3 MMAs, tried first with the flash candidates that
  // step 32 tokens. Its e4m3 Q tile fits MLA's flash kernel in sm_120's 99 KB.
  if (spec.kv_fp8() && prefers_e4m3_mma(arch)) {
    std::vector<VerifyTiles> e4m3;
    // MLA: Q in registers (qsplit) first: no Q fragment reloads per KV tile, 32-token
    // tiles with four stages of packed rows (99 KB); tools/perf_model on sm_120a:
    // 1.26-1.47x the flash e4m3 kernel below on bench_verify's compute-bound MLA
    // shapes, 1.06x on the bytes-bound one, 0.98x on the smallest (fill/drain). Then the
    // flash kernel with 16-row warps (4 x 2, 256 V columns each), whose 64 x 32 tile
    // beats the 32-row warps' 2 x 4 by 1.15-1.3x in tools/perf_model (a warp's 16 S
    // columns take a B fragment pair per Q fragment instead of one tile).
    if (spec.mla()) {
      e4m3 = {{qsplit, 64, 32, 8, 4, 32, true}, {flash, 64, 64, 8, 2, 16, true}, {flash, 64, 32, 8, 2, 16, true}};
    }
    for (VerifyTiles c : candidates) {
      if (c.kernel != flash || c.block_n % 32) continue;
      c.mma_e4m3 = true;
      e4m3.push_back(c);
    }
    candidates.insert(candidates.begin(), e4m3.begin(), e4m3.end());
  }
  for (const VerifyTiles& c : candidates) {
    const int bytes = verify_smem_bytes(spec, c);
    if (bytes > arch.max_smem_per_block) continue;
    // One stage fewer where that fits a second CTA on the SM (not the wgmma family's one
    // tiling, whose registers hold one CTA an SM; gqa64 on the 100 KB
    // parts: 8 warps instead of 4 hide the latency a deeper pipeline would;
    // tools/perf_model predicts 191 -> 164 us for bench_verify's gqa64 on the RTX PRO 6000).
    VerifyTiles shallower = c;
    shallower.stages = c.stages - 1;
    const int threads = c.warps * 32;
    if (c.kernel != VerifyKernel::wgmma && shallower.stages >= 2 && ctas_per_sm(arch, bytes, threads) == 1 &&
        ctas_per_sm(arch, verify_smem_bytes(spec, shallower), threads) >= 2) {
      return shallower;
    }
    return c;
  }
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("{} does not fit {} ({} bytes of shared memory per block)", spec.label(),
                                             arch.name(), arch.max_smem_per_block));
}

}  // namespace

VerifyTiles choose_verify_tiles(const VerifySpec& spec, const Arch& arch) { return choose_tiles(spec, arch, true); }

KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch) {
  return generate_verify_attention(spec, arch, verify_tiles(spec, arch));
}

KernelSource generate_verify_attention(const VerifySpec& spec, const Arch& arch, const VerifyTiles& tiles) {
  // The mma.sync families serve every supported arch; the arch shows in the tiles
  // (choose_verify_tiles). An arch-specific family (sm_90a wgmma) is a VerifyKernel
  // value with its own template, layout and options, dispatched here.
  // The e4m3 MMA path: the block-scaled (double-rate) form where the arch has it,
  // compiled for the arch-specific target; the one difference in the source.
  const bool block_scaled = tiles.mma_e4m3 && has_block_scaled_e4m3_mma(arch);
  if (tiles.mma_e4m3 && !spec.kv_fp8()) {
    fail(KDTREE_ERROR_INTERNAL,
         fmt::format("{}: mma=e4m3 tiles for a spec or family without it ({})", spec.label(), tiles.str()));
  }
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
      {"KV_FP8", spec.kv_fp8() ? "true" : "false"},
      {"MMA_E4M3", tiles.mma_e4m3 ? "true" : "false"},
      {"MMA_BLOCK_SCALED", block_scaled ? "true" : "false"},
      {"KV_ROWS_PACKED", kv_rows_packed(tiles) ? "true" : "false"},
      {"BLOCK_M", std::to_string(tiles.block_m)},
      {"BLOCK_N", std::to_string(tiles.block_n)},
      {"WARPS_M", std::to_string(tiles.warps_m())},
      {"WARPS_N", std::to_string(tiles.warps_n())},
      {"WARP_ROWS", std::to_string(tiles.warp_rows)},
      {"STAGES", std::to_string(tiles.stages)},
      {"COMBINE_THREADS", std::to_string(kCombineThreads)},
      {"COMBINE_ROW_THREADS", std::to_string(combine_row_threads)},
  };
  KernelSource src;
  src.op = "verify_attention";
  src.label = spec.label();
  src.file_stem = fmt::format(
      "verify_attention-{}-W{}-p{}-{}{}",
      spec.mla() ? fmt::format("mla{}x{}", spec.head_dim_qk, spec.head_dim_v) : fmt::format("gqa{}", spec.head_dim_qk),
      spec.max_tree_nodes, spec.page_size, dtype_name(spec.dtype), spec.kv_fp8() ? "-kv_e4m3" : "");
  std::string kernel_template;
  int producer_threads = 0;  // beyond tiles.warps (the GQA wgmma kernel's producer warpgroup)
  std::vector<std::string> headers = {"verify_attention_params.h", "verify_attention_layout.h", "kv_fp8.cuh",
                                      "verify_attention_common.cuh", "verify_attention_combine.cuh"};
  // A family whose segment walk runs stream-K plans, merged by their own combine.
  auto runs_stream_k = [&] {
    src.entry_points = {"kdtree_verify_attention", "kdtree_verify_combine", "kdtree_verify_combine_stream"};
    src.launch.stream_k = true;
    headers.push_back("verify_attention_combine_stream.cuh");
  };
  switch (tiles.kernel) {
    case VerifyKernel::flash: {
      const FlashSmemLayout smem = flash_smem_layout(spec, tiles);
      kernel_template = "verify_attention";
      params["SMEM_Q_SCALE"] = std::to_string(smem.q_scale);
      params["SMEM_K"] = std::to_string(smem.k);
      params["SMEM_V"] = std::to_string(smem.v);
      params["SMEM_P"] = std::to_string(smem.p);
      params["SMEM_RED"] = std::to_string(smem.red);
      src.launch.dynamic_smem = smem.bytes;
      src.entry_points = {"kdtree_verify_attention", "kdtree_verify_combine"};
      break;
    }
    case VerifyKernel::wgmma: {
      const WgmmaSmemLayout smem = wgmma_smem_layout(spec, tiles);
      if (!spec.mla()) {
        kernel_template = "verify_attention_wgmma_gqa";
        params["SMEM_K"] = std::to_string(smem.k);
        params["SMEM_V"] = std::to_string(smem.v);
        params["SMEM_BAR"] = std::to_string(smem.bar);
        params["SMEM_RAW"] = std::to_string(smem.raw);
        params["RAW_STAGES"] = std::to_string(smem.raw_stages);
        src.launch.dynamic_smem = smem.bytes;
        producer_threads = 128;  // the producer warpgroup (it copies; setmaxnreg gives its registers away)
        src.entry_points = {"kdtree_verify_attention", "kdtree_verify_combine"};
        headers.push_back("wgmma.cuh");
        headers.push_back("verify_attention_wgmma_rows.cuh");
        break;
      }
      kernel_template = tiles.mma_e4m3 ? "verify_attention_wgmma_e4m3" : "verify_attention_wgmma";
      if (tiles.mma_e4m3) {
        params["SMEM_P1"] = std::to_string(smem.p1);
        params["SMEM_SCALE"] = std::to_string(smem.scale);
      }
      params["SMEM_K"] = std::to_string(smem.k);
      params["SMEM_P"] = std::to_string(smem.p);
      params["SMEM_RED"] = std::to_string(smem.red);
      params["SMEM_BAR"] = std::to_string(smem.bar);
      params["SMEM_ROWS"] = std::to_string(smem.rows);
      params["SMEM_WALK"] = std::to_string(smem.walk);
      // A segment starts with Q and a pair of tiles in flight and ends with 64 x 512 partials:
      // on the H200 uniform splits beat stream-K where the 1.5-tile estimate chose it (B=1
      // H=128 n=16 32K: 262 against 278 us; B=4 H=128 n=64 8K: 960 against 976).
      src.launch.stream_segment_tiles = 4.0;
      // Whole tiles by TMA, a box per (page run of the tile, 64-dim column block).
      src.launch.kv_tma_box_rows = std::min(spec.page_size, tiles.block_n);
      params["KV_TMA_BOX_ROWS"] = std::to_string(src.launch.kv_tma_box_rows);
      src.launch.dynamic_smem = smem.bytes;
      runs_stream_k();
      // Uniform splits merged in a thread-block cluster: a split stores its rows as 16-bit
      // split partials in its idle K slots (verify_attention_wgmma_common.cuh).
      src.launch.cluster_merge = true;
      src.launch.cluster_two_splits = true;  // H200: mla B=64 H=8 n=8 4K 101.3 -> 93.7 us bf16, 74.4 -> 69.8 e4m3
      src.entry_points.push_back("kdtree_verify_attention_cluster");
      headers.push_back("wgmma.cuh");
      headers.push_back("verify_attention_tma.h");
      headers.push_back("verify_attention_wgmma_rows.cuh");
      headers.push_back("verify_attention_wgmma_common.cuh");
      break;
    }
    case VerifyKernel::qsplit: {
      const QsplitSmemLayout smem = qsplit_smem_layout(spec, tiles);
      kernel_template = "verify_attention_qsplit";
      params["SMEM_PART_S"] = std::to_string(smem.part_s);
      params["SMEM_P"] = std::to_string(smem.p);
      params["SMEM_STATS"] = std::to_string(smem.stats);
      params["SMEM_Q_SCALE"] = std::to_string(smem.q_scale);
      params["SMEM_WALK"] = std::to_string(smem.walk);
      // Splits merged in a cluster leave their 16-bit rows (16 bytes of padding each) and an
      // LSE per row in the K stages (templates/verify_attention_qsplit.cu: CLUSTER_LSE).
      // The e4m3 MMA path only: the 16-bit path's registers leave no room for the merge.
      src.launch.cluster_merge = tiles.mma_e4m3 && tiles.block_m * ((spec.head_dim_v + 8) * 2 + 4) <= smem.part_s;
      params["CLUSTER_MERGE"] = src.launch.cluster_merge ? "1" : "0";
      if (block_scaled) {
        // sm_120a: QMMA.SF at twice the bf16 rate, the modelled tile at 87% of it. The
        // KV's bytes then bind a call like mla B=64 H=8 n=8 4K, whose two splits merged
        // in a cluster (no partials, no combine) are predicted at 94.0 us against 110.8
        // with stream-K (docs/PERFORMANCE.md; 96.0 at 2.2 GHz even if DSMEM were 4x
        // slower than Hopper's). On the H200 the same kernel is even either way.
        src.launch.tensor_rate = 1.75;
        src.launch.cluster_two_splits = src.launch.cluster_merge;
      } else if (arch.sm >= 120) {
        // The 16-bit path's modelled sm_120 tile runs at 87% of the bf16 rate: the same call's
        // 302 MB of 16-bit KV bind too, and two uniform splits (predicted 189.2 us) beat
        // stream-K (195.3), whose partials add to the bytes.
        src.launch.tensor_rate = 0.87;
      }
      src.launch.dynamic_smem = smem.bytes;
      runs_stream_k();
      if (src.launch.cluster_merge) src.entry_points.push_back("kdtree_verify_attention_cluster");
      break;
    }
  }
  set_template_source(src, kernel_template, params, headers);
  // wgmma exists on sm_90a only; the block-scaled e4m3 MMA on sm_120a/sm_121a.
  src.arch_specific = block_scaled || tiles.kernel == VerifyKernel::wgmma;
  src.launch.kernel = tiles.str();
  src.launch.threads = tiles.warps * 32 + producer_threads;
  src.launch.block_m = tiles.block_m;
  src.launch.block_n = tiles.block_n;
  src.launch.kv_row_bytes = spec.kv_row_bytes();
  src.launch.combine_threads = kCombineThreads;
  src.launch.combine_rows = kCombineThreads / combine_row_threads;
  return src;
}

}  // namespace kdtree::codegen
