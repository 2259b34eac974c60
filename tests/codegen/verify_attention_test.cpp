#include <doctest/doctest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/kv_compact.hpp"
#include "codegen/verify_attention.hpp"
#include "tests/support/env_var.hpp"
#include "verify_attention_layout.h"

using namespace kdtree::codegen;

namespace {
kdtree_verify_spec mla_spec() { return {576, 512, 16, 1, 64, 64, KDTREE_DTYPE_BF16}; }

std::string error_of(const kdtree_verify_spec& s, kdtree_status* status = nullptr) {
  try {
    validate_verify_spec(s);
  } catch (const kdtree::Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("verify spec validation names the supported values") {
  CHECK(validate_verify_spec(mla_spec()).label() == "verify_attention[mla576/512,W=64,page=64,bf16]");
  kdtree_verify_spec s = mla_spec();
  kdtree_status status = KDTREE_OK;
  s.head_dim_qk = 96;
  s.head_dim_v = 96;
  std::string msg = error_of(s, &status);
  CHECK(status == KDTREE_ERROR_UNSUPPORTED);
  CHECK(msg.find("576/512") != std::string::npos);
  CHECK(msg.find("128/128") != std::string::npos);

  s = mla_spec();
  s.max_tree_nodes = 48;
  CHECK(error_of(s).find("16, 32, 64 or 128") != std::string::npos);
  s = mla_spec();
  s.page_size = 8;
  CHECK(error_of(s).find("page_size 8") != std::string::npos);
  s = mla_spec();
  s.dtype = KDTREE_DTYPE_F32;
  CHECK(error_of(s).find("bf16 or f16") != std::string::npos);
  s = mla_spec();
  s.num_kv_heads = 2;
  s.num_q_heads = 16;
  CHECK(error_of(s, &status).find("num_kv_heads must be 1") != std::string::npos);
  CHECK(status == KDTREE_ERROR_INVALID_ARGUMENT);
  s = {128, 128, 12, 8, 16, 32, KDTREE_DTYPE_F16};
  CHECK(error_of(s).find("not a multiple") != std::string::npos);
}

TEST_CASE("page sizes: one list for verify_attention, kv_compact and the messages[page -1..300]") {
  CHECK(supported_page_sizes() == std::vector<int>{1, 16, 32, 64, 128});
  CHECK(supported_page_sizes_text() == "1, 16, 32, 64 or 128");
  for (int page = -1; page <= 300; ++page) {
    INFO("page ", page);
    kdtree_verify_spec s = mla_spec();
    s.page_size = page;
    KvCompactSpec kv;
    kv.page_size = page;
    bool kv_ok = true;
    try {
      validate(kv);
    } catch (const kdtree::Error&) {
      kv_ok = false;
    }
    CHECK(error_of(s).empty() == is_supported_page_size(page));
    CHECK(kv_ok == is_supported_page_size(page));
  }
}

TEST_CASE("head and dtype names round-trip") {
  int qk = 0, v = 0;
  parse_head_name("gqa256", &qk, &v);
  CHECK(qk == 256);
  CHECK(v == 256);
  parse_head_name("mla576/512", &qk, &v);
  CHECK(qk == 576);
  CHECK(v == 512);
  CHECK_THROWS_AS(parse_head_name("gqa96", &qk, &v), kdtree::Error);
  CHECK(parse_dtype("f16") == KDTREE_DTYPE_F16);
  CHECK_THROWS_AS(parse_dtype("fp8"), kdtree::Error);
}

TEST_CASE("tiles fit each arch's shared memory") {
  for (int sm : {80, 86, 89, 90, 120}) {
    Arch arch = arch_from_sm(sm);
    for (const char* head : {"mla576/512", "gqa64", "gqa128", "gqa256"}) {
      VerifySpec spec;
      parse_head_name(head, &spec.head_dim_qk, &spec.head_dim_v);
      VerifyTiles t = choose_verify_tiles(spec, arch);
      INFO(spec.label() << " on " << arch.name());
      CHECK(verify_smem_bytes(spec, t) <= arch.max_smem_per_block);
      // The launch asks for the shared memory the generator laid out.
      CHECK(generate_verify_attention(spec, arch).launch.dynamic_smem == verify_smem_bytes(spec, t));
      CHECK((t.warp_rows == 16 || t.warp_rows == 32));
      CHECK(t.block_m % t.warp_rows == 0);
      CHECK(t.stages >= 2);
    }
  }
  // gqa64 on the 100 KB parts drops a stage to fit two CTAs per SM; sm_90's GQA over 16-bit caches is the
  // wgmma family's one tiling (its registers hold one CTA an SM), over e4m3 caches flash's three stages.
  VerifySpec gqa64;
  gqa64.head_dim_qk = gqa64.head_dim_v = 64;
  VerifyTiles g120 = choose_verify_tiles(gqa64, arch_from_sm(120));
  CHECK(g120.block_m == 128);
  CHECK(g120.stages == 2);
  CHECK(ctas_per_sm(arch_from_sm(120), verify_smem_bytes(gqa64, g120), g120.warps * 32) == 2);
  // sm_120's gqa256 takes the tiles tools/perf_model chose for it (validated on the H200) as they are.
  VerifySpec gqa256;
  gqa256.head_dim_qk = gqa256.head_dim_v = 256;
  CHECK(choose_verify_tiles(gqa256, arch_from_sm(120)).str() ==
        "kernel=flash,block_m=128,block_n=16,warps=8,stages=2,warp_rows=16");
  gqa256.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  CHECK(choose_verify_tiles(gqa256, arch_from_sm(120)).str() ==
        "kernel=flash,block_m=128,block_n=32,warps=8,stages=3,warp_rows=16,mma=e4m3");
  CHECK(choose_verify_tiles(gqa256, arch_from_sm(89)).str() != choose_verify_tiles(gqa256, arch_from_sm(120)).str());
  CHECK(choose_verify_tiles(gqa64, arch_from_sm(90)).str() ==
        "kernel=wgmma,block_m=128,block_n=128,warps=8,stages=4,warp_rows=16");
  VerifySpec gqa64_e4m3 = gqa64;
  gqa64_e4m3.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  CHECK(choose_verify_tiles(gqa64_e4m3, arch_from_sm(90)).str() ==
        "kernel=wgmma,block_m=128,block_n=128,warps=8,stages=4,warp_rows=16");
  // MLA on the 99 KB parts: Q in registers (qsplit) keeps 64 rows in 2 x 4 warps.
  VerifySpec mla;
  for (int sm : {86, 89, 120}) {
    const VerifyTiles m = choose_verify_tiles(mla, arch_from_sm(sm));
    INFO("sm_" << sm);
    CHECK(m.kernel == VerifyKernel::qsplit);
    CHECK(m.block_m == 64);
    CHECK(m.warps == 8);
    CHECK(generate_verify_attention(mla, arch_from_sm(sm)).source.find("Q lives in registers") != std::string::npos);
  }
  // Hopper: the wgmma family, its native e4m3 form for e4m3 caches.
  CHECK(choose_verify_tiles(mla, arch_from_sm(90)).kernel == VerifyKernel::wgmma);
  VerifySpec mla_e4m3 = mla;
  mla_e4m3.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  CHECK(choose_verify_tiles(mla_e4m3, arch_from_sm(90)).kernel == VerifyKernel::wgmma);
  CHECK(choose_verify_tiles(mla_e4m3, arch_from_sm(90)).mma_e4m3);
  for (int sm : {80, 86, 89, 100, 120}) CHECK(choose_verify_tiles(mla, arch_from_sm(sm)).kernel != VerifyKernel::wgmma);
  CHECK(choose_verify_tiles(mla, arch_from_sm(80)).kernel == VerifyKernel::flash);
  // The wgmma layout: Q's latent dims, slot 1's P (where Q's rope block would lie), two K slots, slot 0's P on
  // 1024-byte swizzle atoms, the row exchange, the mbarriers, the walk.
  const VerifyTiles w90 = choose_verify_tiles(mla, arch_from_sm(90));
  CHECK(parse_verify_tiles("kernel=wgmma", mla, arch_from_sm(90)).str() == w90.str());
  CHECK(w90.str() == "kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16");
  const WgmmaSmemLayout wl = wgmma_smem_layout(mla, w90);
  CHECK(wl.p1 == 64 * 512 * 2);
  CHECK(wl.k == wl.p1 + 64 * 64 * 2);
  CHECK(wl.p == wl.k + 2 * 64 * 576 * 2);
  CHECK(wl.red == wl.p + 64 * 64 * 2);
  CHECK(wl.bar == wl.red + 2 * 64 * 4);
  CHECK(wl.rows == wl.bar + 2 * 3 * 8);
  CHECK(wl.walk == wl.rows + 2 * 64 * 4);
  CHECK(wl.bytes == wl.walk + KDTREE_SEGMENT_WALK_BYTES);
  CHECK(wl.p1 % 1024 == 0);
  CHECK(wl.k % 1024 == 0);
  CHECK(wl.p % 1024 == 0);
  CHECK(wl.bar % 8 == 0);
  CHECK(wl.bytes <= arch_from_sm(90).max_smem_per_block);
  CHECK(wl.str() ==
        fmt::format("q=0,p1={},k={},v=0,p={},red={},scale=0,bar={},rows={},walk={},raw=0,raw_stages=0,bytes={}", wl.p1,
                    wl.k, wl.p, wl.red, wl.bar, wl.rows, wl.walk, wl.bytes));
  // Over e4m3 caches (mma=e4m3): Q's latent codes, four slots of 5 128-byte column blocks, both P tiles, the
  // row exchange, the scales, then as above; its own template, sm_90a, TMA boxes of 128 e4m3 dims.
  const VerifyTiles w90e = parse_verify_tiles("kernel=wgmma", mla_e4m3, arch_from_sm(90));
  const WgmmaSmemLayout we = wgmma_smem_layout(mla_e4m3, w90e);
  CHECK(we.k == 64 * 512);
  CHECK(we.p == we.k + 4 * 64 * 5 * 128);
  CHECK(we.p1 == we.p + 64 * 128);
  CHECK(we.red == we.p1 + 64 * 128);
  CHECK(we.scale == we.red + 2 * 64 * 4);
  CHECK(we.bar == we.scale + 3 * 64 * 4);
  CHECK(we.walk == we.bar + 4 * 3 * 8 + 4 * 64 * 4);
  CHECK(we.bytes <= arch_from_sm(90).max_smem_per_block);
  CHECK(we.bytes == we.walk + KDTREE_SEGMENT_WALK_BYTES);
  for (int off : {we.k, we.p, we.p1}) CHECK(off % 1024 == 0);
  const KernelSource wse = generate_verify_attention(mla_e4m3, arch_from_sm(90), w90e);
  CHECK(wse.arch_specific);
  CHECK(wse.launch.stream_k);
  CHECK(wse.launch.dynamic_smem == we.bytes);
  CHECK(wse.launch.kv_tma_box_rows == 64);
  CHECK(wse.source.find("verify_attention_wgmma_e4m3") != std::string::npos);
  CHECK(wse.source.find("#define KD_SMEM_SCALE " + std::to_string(we.scale)) != std::string::npos);
  const KernelSource ws = generate_verify_attention(mla, arch_from_sm(90), w90);
  CHECK(ws.arch_specific);  // sm_90a
  CHECK(ws.launch.stream_k);
  CHECK(ws.launch.threads == 256);
  CHECK(ws.launch.dynamic_smem == wl.bytes);
  CHECK(ws.source.find("wgmma.cuh") != std::string::npos);
  CHECK(ws.source.find("KD_SMEM_SCALE") == std::string::npos);  // the 16-bit kernel's prelude is unchanged
  // Whole tiles by TMA: boxes of one page run (at most a tile) x 64 dims, the descriptor as a second parameter.
  CHECK(ws.launch.kv_tma_box_rows == 64);
  CHECK(ws.source.find("verify_attention_tma.h") != std::string::npos);
  // GQA on the wgmma family (templates/verify_attention_wgmma_gqa.cu): Q | K stages | V stages | full and
  // empty mbarriers; 128 rows, a producer warpgroup beyond the 8 consumer warps; uniform splits, no TMA.
  // Over e4m3 caches the stages stay 16-bit (the producer dequantises) and the tiles' cache bytes sit
  // before the mbarriers, two tiles of them where they fit.
  for (int d : {64, 128, 256}) {
    for (kdtree_kv_dtype kv : {KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3}) {
      VerifySpec g;
      g.head_dim_qk = g.head_dim_v = d;
      g.kv_dtype = kv;
      const VerifyTiles gt = parse_verify_tiles("kernel=wgmma", g, arch_from_sm(90));
      INFO("gqa" << d << " " << gt.str() << " kv_fp8 " << g.kv_fp8());
      CHECK(gt.block_m == 128);
      CHECK(gt.block_n == (d == 256 ? 64 : 128));
      CHECK(!gt.mma_e4m3);
      const WgmmaSmemLayout gl = wgmma_smem_layout(g, gt);
      const int tile = gt.block_n * d * 2;
      CHECK(gl.k == 128 * d * 2);
      CHECK(gl.v == gl.k + gt.stages * tile);
      CHECK(gl.raw == gl.v + gt.stages * tile);
      CHECK(gl.raw_stages == (g.kv_fp8() ? (d == 256 ? 1 : 2) : 0));
      CHECK(gl.bar == gl.raw + gl.raw_stages * 2 * gt.block_n * d);
      CHECK(gl.bytes == gl.bar + 4 * gt.stages * 8);
      CHECK(gl.bytes <= arch_from_sm(90).max_smem_per_block);
      for (int off : {gl.k, gl.v, gl.raw, tile}) CHECK(off % 1024 == 0);
      const KernelSource gs = generate_verify_attention(g, arch_from_sm(90), gt);
      CHECK(gs.arch_specific);
      CHECK(!gs.launch.stream_k);
      CHECK(gs.launch.kv_tma_box_rows == 0);
      CHECK(gs.launch.threads == 8 * 32 + 128);
      CHECK(gs.launch.dynamic_smem == gl.bytes);
      CHECK(gs.source.find("verify_attention_wgmma_gqa") != std::string::npos);
    }
  }
  for (int page : {1, 16, 64, 128}) {
    VerifySpec paged = mla;
    paged.page_size = page;
    CHECK(generate_verify_attention(paged, arch_from_sm(90), w90).launch.kv_tma_box_rows == std::min(page, 64));
  }
  // The other families take one parameter and no descriptor.
  CHECK(generate_verify_attention(mla_e4m3, arch_from_sm(89)).launch.kv_tma_box_rows == 0);
  CHECK(generate_verify_attention(mla, arch_from_sm(120)).launch.kv_tma_box_rows == 0);
  CHECK(generate_verify_attention(mla, arch_from_sm(120)).source.find("verify_attention_tma.h") == std::string::npos);
  CHECK(!generate_verify_attention(mla_e4m3, arch_from_sm(89)).arch_specific);
  // Its layout: K stages, partial S, P, row stats, the segment walk in order; Q is staged over them first.
  const VerifyTiles q120 = choose_verify_tiles(mla, arch_from_sm(120));
  CHECK(q120.str() == "kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32");
  const QsplitSmemLayout l = qsplit_smem_layout(mla, q120);
  CHECK(l.part_s == q120.stages * q120.block_n * 576 * 2);
  CHECK(l.p == l.part_s + q120.warps * q120.warp_rows * q120.block_n * 4);
  CHECK(l.stats == l.p + q120.block_m * q120.block_n * 2);
  CHECK(l.walk == l.stats + KDTREE_QSPLIT_STATS * q120.block_m * 4);
  CHECK(l.bytes == l.walk + KDTREE_SEGMENT_WALK_BYTES);
  CHECK(l.walk >= q120.block_m * 576 * 2);  // past Q's staging
  // e4m3 caches: smaller stages, so the walk moves past Q's staging, not onto it.
  VerifySpec mla8 = mla;
  mla8.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  const QsplitSmemLayout l8 = qsplit_smem_layout(mla8, q120);
  CHECK(l8.stats + KDTREE_QSPLIT_STATS * q120.block_m * 4 < q120.block_m * 576 * 2);
  CHECK(l8.walk == q120.block_m * 576 * 2);
  CHECK(l.q_scale == q120.block_m * 576 * 2);  // only the e4m3 MMA path stages row scales there
  CHECK(l.str() == fmt::format("k=0,part_s={},p={},stats={},q_scale={},walk={},bytes={}", l.part_s, l.p, l.stats,
                               l.q_scale, l.walk, l.bytes));
  // The flash layout: Q at 0, K and V stages, P (column warps > 1), the row exchange.
  const VerifyTiles f90 = parse_verify_tiles("kernel=flash,warp_rows=32", mla, arch_from_sm(90));
  const FlashSmemLayout fl = flash_smem_layout(mla, f90);
  CHECK(f90.str() == "kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32");
  CHECK(fl.k == 64 * 576 * 2);
  CHECK(fl.v == fl.k + 2 * 64 * 576 * 2);
  CHECK(fl.p == fl.v);  // MLA: no V stages
  CHECK(fl.red == fl.p + 64 * 64 * 2);
  CHECK(fl.bytes == fl.red + 4 * 64 * 4);
  CHECK(fl.str() ==
        fmt::format("q=0,q_scale={},k={},v={},p={},red={},bytes={}", fl.q_scale, fl.k, fl.v, fl.p, fl.red, fl.bytes));
  // The generator carries the tiles' name with the launch facts (logs, tools).
  CHECK(generate_verify_attention(mla, arch_from_sm(120)).launch.kernel == q120.str());
  // sm_120 is held to 99 KB per block.
  CHECK(arch_from_sm(120).max_smem_per_block == 99 * 1024);
  CHECK_THROWS_AS(arch_from_sm(75), kdtree::Error);
  CHECK(parse_arch("sm_90").sm == 90);
  CHECK_THROWS_AS(parse_arch("hopper"), kdtree::Error);
}

TEST_CASE("generated source is specialised per shape") {
  VerifySpec a, b;
  b.page_size = 16;
  Arch arch = arch_from_sm(120);
  KernelSource sa = generate_verify_attention(a, arch);
  KernelSource sb = generate_verify_attention(b, arch);
  CHECK(sa.source != sb.source);
  CHECK(sa.file_stem == "verify_attention-mla576x512-W64-p64-bf16");
  CHECK(sa.source.find("#define KD_PAGE_SIZE 64\n") != std::string::npos);
  // sm_90 has room for larger tiles than sm_120.
  CHECK(generate_verify_attention(a, arch_from_sm(90)).source != sa.source);
}

namespace {

// The message parse_verify_tiles throws for `text` (INVALID_ARGUMENT), or "" when it accepts it.
std::string tiles_error(const std::string& text, const VerifySpec& spec, const Arch& arch) {
  try {
    parse_verify_tiles(text, spec, arch);
  } catch (const kdtree::Error& e) {
    CHECK(e.status() == KDTREE_ERROR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("KDTREE_VERIFY_TILES overrides the tiles and is validated") {
  VerifySpec mla;
  VerifySpec gqa64;
  gqa64.head_dim_qk = gqa64.head_dim_v = 64;
  const kdtree::test::EnvVar env("KDTREE_VERIFY_TILES",
                                 "kernel=flash,block_m=32,block_n=16,warps=4,stages=3,warp_rows=16");
  VerifyTiles t = verify_tiles(mla, arch_from_sm(90));
  CHECK(t.kernel == VerifyKernel::flash);
  CHECK(t.block_m == 32);
  CHECK(t.block_n == 16);
  CHECK(t.warps == 4);
  CHECK(t.stages == 3);
  CHECK(t.warp_rows == 16);
  // The generator's own choice does not read the environment.
  CHECK(choose_verify_tiles(mla, arch_from_sm(90)).block_n == 64);
  // Keys left out keep the generator's choice: only the stages change.
  ::setenv("KDTREE_VERIFY_TILES", "stages=3", 1);
  VerifyTiles chosen = choose_verify_tiles(mla, arch_from_sm(120));
  chosen.stages = 3;
  CHECK(verify_tiles(mla, arch_from_sm(120)).str() == chosen.str());
  // gqa64 split over two column warps would cut a swizzle group: rejected by name.
  ::setenv("KDTREE_VERIFY_TILES", "block_m=32,block_n=16,warps=4,stages=3,warp_rows=16", 1);
  CHECK_THROWS_AS(verify_tiles(gqa64, arch_from_sm(90)), kdtree::Error);
  // 64 rows of 32-row warps, 8 warps = 2 x 4.
  ::setenv("KDTREE_VERIFY_TILES", "kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32", 1);
  t = verify_tiles(mla, arch_from_sm(90));
  CHECK(t.warp_rows == 32);
  const KernelSource src = generate_verify_attention(mla, arch_from_sm(90));
  CHECK(src.source.find("#define KD_WARP_ROWS 32\n") != std::string::npos);
  CHECK(src.launch.threads == 256);
  CHECK(src.launch.block_n == 64);
  CHECK(src.launch.kernel == t.str());
  ::unsetenv("KDTREE_VERIFY_TILES");
  CHECK(verify_tiles(mla, arch_from_sm(90)).block_n == 64);
}

TEST_CASE("KDTREE_VERIFY_TILES: every key is checked, nothing trailing, an override that does not fit is an error") {
  VerifySpec mla;
  const Arch sm90 = arch_from_sm(90), sm120 = arch_from_sm(120);
  CHECK(tiles_error("kernel=flash,block_m=32,block_n=16,warps=4,stages=3,warp_rows=16", mla, sm90).empty());
  CHECK(tiles_error("kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16", mla, sm90).empty());
  // The wgmma family: one tiling, MLA over 16-bit caches, sm_90 only; each says so.
  CHECK(tiles_error("kernel=wgmma,block_n=32", mla, sm90).find("one tiling") != std::string::npos);
  CHECK(tiles_error("kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16", mla, sm120).find("sm_90") !=
        std::string::npos);
  CHECK(tiles_error("kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16", mla, arch_from_sm(100))
            .find("sm_90") != std::string::npos);
  VerifySpec mla8;
  mla8.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  // e4m3 caches: kernel=wgmma alone takes the native e4m3 form; the 16-bit form does not read them.
  CHECK(tiles_error("kernel=wgmma", mla8, sm90).empty());
  CHECK(parse_verify_tiles("kernel=wgmma", mla8, sm90).str() ==
        "kernel=wgmma,block_m=64,block_n=64,warps=8,stages=4,warp_rows=16,mma=e4m3");
  CHECK(tiles_error("kernel=wgmma,stages=2", mla8, sm90).empty());
  CHECK(tiles_error("kernel=wgmma,stages=3", mla8, sm90).find("stages=4") != std::string::npos);
  CHECK(tiles_error("kernel=wgmma,mma=16bit", mla8, sm90).find("mma=e4m3") != std::string::npos);
  CHECK(tiles_error("kernel=wgmma,mma=e4m3", mla, sm90).find("e4m3 caches") != std::string::npos);
  VerifySpec gqa;
  gqa.head_dim_qk = gqa.head_dim_v = 128;
  // GQA: the wgmma family's GQA kernel, one tiling per head dim.
  CHECK(tiles_error("kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16", gqa, sm90).find("one tiling") !=
        std::string::npos);
  CHECK(parse_verify_tiles("kernel=wgmma", gqa, sm90).str() ==
        "kernel=wgmma,block_m=128,block_n=128,warps=8,stages=3,warp_rows=16");
  CHECK(tiles_error("kernel=wgmma,stages=2", gqa, sm90).empty());  // fewer stages: tuning
  CHECK(tiles_error("kernel=wgmma,stages=4", gqa, sm90).find("stages 2 to 3") != std::string::npos);
  VerifySpec gqa8 = gqa;
  gqa8.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  // e4m3 GQA caches: the same kernel, its producer dequantising (16-bit MMAs, never mma=e4m3); gqa128 keeps
  // two stages to leave room for two tiles of cache bytes.
  const VerifyTiles t8 = parse_verify_tiles("kernel=wgmma", gqa8, sm90);
  CHECK(t8.str() == "kernel=wgmma,block_m=128,block_n=128,warps=8,stages=2,warp_rows=16");
  CHECK(wgmma_smem_layout(gqa8, t8).raw_stages == 2);
  CHECK(wgmma_smem_layout(gqa8, t8).bar == wgmma_smem_layout(gqa8, t8).raw + 2 * 2 * 128 * 128);
  CHECK(tiles_error("kernel=wgmma,mma=e4m3", gqa8, sm90).find("one tiling") != std::string::npos);
  // mma=e4m3 alone where the generator's GQA kernel is the wgmma one: the portable families' choice takes it.
  const VerifyTiles m8 = parse_verify_tiles("mma=e4m3", gqa8, sm90);
  CHECK(m8.kernel == VerifyKernel::flash);
  CHECK(m8.mma_e4m3);
  CHECK(tiles_error("kernel=hopper", mla, sm90).find("flash, qsplit or wgmma") != std::string::npos);
  CHECK(tiles_error("kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32", mla, sm90).empty());
  CHECK(tiles_error("kernel=qsplit,block_m=64,block_n=16,warps=8,stages=3,warp_rows=32", mla, sm90).empty());
  CHECK(tiles_error("kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32", mla, sm120).empty());
  // Only the kernel: sm_90's flash tiles (64-token stages) do not suit qsplit, which says why.
  CHECK(tiles_error("kernel=qsplit", mla, sm90).find("block_n 16") != std::string::npos);
  VerifySpec gqa128;
  gqa128.head_dim_qk = gqa128.head_dim_v = 128;
  CHECK(tiles_error("kernel=qsplit,block_m=64,block_n=16,warps=8,stages=3,warp_rows=32", gqa128, sm90).find("qsplit") !=
        std::string::npos);  // MLA only
  struct Bad {
    const char* text;
    const char* names;  // what the message must name
  };
  const std::string base = "kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32";
  // A zero or negative block once reached the split plan's ceil_div (SIGFPE).
  for (const Bad& bad : {Bad{"block_n=0", "block_n"},
                         Bad{"block_n=-16", "block_n"},
                         Bad{"block_m=0", "block_m"},
                         Bad{"block_m=-64", "block_m"},
                         Bad{"warps=0", "warps"},
                         Bad{"stages=1", "stages"},
                         Bad{"warp_rows=24", "warp_rows"},
                         Bad{"warp_rows=32x", "warp_rows"},
                         Bad{"kernel=1", "kernel"},
                         Bad{"kernel=Qsplit", "kernel"},
                         Bad{"kernel=qsplit,block_n=32", "qsplit"},
                         Bad{"kernel=qsplit,block_n=16,warps=4,stages=3,warp_rows=16", "qsplit"},
                         Bad{"stages=2,stages=3", "twice"},
                         Bad{"block_m", "key=value"},
                         Bad{"=64", "key=value"},
                         Bad{"block_m=64,", "key=value"},
                         Bad{"tile=64", "unknown key 'tile'"},
                         Bad{" block_m=64", "unknown key ' block_m'"},
                         Bad{"stages=2 ", "stages"},
                         Bad{"block_n=72", "block_n"},
                         Bad{"block_m=48", "block_m"},
                         Bad{"warps=6", "warps"},
                         Bad{"warp_rows=99999999999", "warp_rows"}}) {
    const std::string message = tiles_error(bad.text, mla, sm90);
    INFO(bad.text << ": " << message);
    CHECK(message.find("KDTREE_VERIFY_TILES") != std::string::npos);
    CHECK(message.find(bad.names) != std::string::npos);
  }
  // The old positional form is refused, with its key=value spelling.
  const std::string old = tiles_error("64,16,8,4,32,qsplit", mla, sm120);
  INFO(old);
  CHECK(old.find("positional form") != std::string::npos);
  CHECK(old.find("kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32") == std::string::npos);
  CHECK(old.find("block_m=64,block_n=16,warps=8,stages=4,warp_rows=32,kernel=qsplit") != std::string::npos);
  // sm_90's MLA tiles need ~150 KB of shared memory: on sm_120 that is an error, not ignored.
  const std::string too_big = tiles_error(base, mla, sm120);
  INFO(too_big);
  CHECK(too_big.find("do not fit sm_120") != std::string::npos);
}
