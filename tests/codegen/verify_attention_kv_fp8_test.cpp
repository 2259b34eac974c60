// verify_attention with e4m3 KV caches: one kernel source per family, the cache
// dtype a compile-time switch; fp8 rows in shared memory (half the bytes), and
// every head compiles without spills for sm_80, sm_90 and sm_120.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/error.hpp"
#include "codegen/arch.hpp"
#include "codegen/render.hpp"
#include "codegen/verify_attention.hpp"
#include "runtime/runtime.hpp"
#include "verify_attention_layout.h"

using namespace kdtree::codegen;
namespace fs = std::filesystem;

namespace {

VerifySpec spec_of(const HeadShape& h, kdtree_kv_dtype kv) {
  VerifySpec s;
  s.head_dim_qk = h.head_dim_qk;
  s.head_dim_v = h.head_dim_v;
  s.kv_dtype = kv;
  return s;
}

}  // namespace

TEST_CASE("verify_attention[kv=e4m3]: the source differs from the 16-bit cache's in KD_KV_FP8 alone") {
  for (const HeadShape& h : supported_heads()) {
    for (int sm : {80, 90, 120}) {
      const Arch arch = arch_from_sm(sm);
      const VerifySpec fp8 = spec_of(h, KDTREE_KV_DTYPE_E4M3), bf16 = spec_of(h, KDTREE_KV_DTYPE_AS_Q);
      INFO(fp8.label() << " " << arch.name());
      VerifyTiles tiles = choose_verify_tiles(fp8, arch);
      tiles.mma_e4m3 = false;  // the dequantising path: the e4m3 MMA path is tested below
      const KernelSource a = generate_verify_attention(fp8, arch, tiles);
      const KernelSource b = generate_verify_attention(bf16, arch, tiles);
      CHECK(a.label == b.label.substr(0, b.label.size() - 1) + ",kv=e4m3]");
      CHECK(a.file_stem == b.file_stem + "-kv_e4m3");
      std::string sa = a.source, sb = b.source;
      const std::string on = "#define KD_KV_FP8 true\n", off = "#define KD_KV_FP8 false\n";
      REQUIRE(sa.find(on) != std::string::npos);
      REQUIRE(sb.find(off) != std::string::npos);
      sa.replace(sa.find(on), on.size(), off);
      // The shared-memory offsets differ (fp8 stages are half the bytes; the GQA wgmma kernel, whose
      // producer dequantises into 16-bit stages, adds its tiles of cache bytes: KD_RAW_STAGES); the rest is
      // the same text.
      const bool dequantising_producer = tiles.kernel == VerifyKernel::wgmma && !fp8.mla();
      auto strip_smem = [](std::string s) {
        std::string out;
        for (size_t at = 0; at < s.size();) {
          const size_t end = s.find('\n', at);
          const std::string line = s.substr(at, end - at);
          if (line.rfind("#define KD_SMEM_", 0) != 0 && line.rfind("#define KD_RAW_STAGES ", 0) != 0)
            out += line + "\n";
          at = end == std::string::npos ? s.size() : end + 1;
        }
        return out;
      };
      CHECK(strip_smem(sa) == strip_smem(sb));
      CHECK(dequantising_producer == (sm == 90 && !fp8.mla()));
      if (dequantising_producer) {
        CHECK(a.launch.dynamic_smem > b.launch.dynamic_smem);
        CHECK(a.launch.dynamic_smem <= arch.max_smem_per_block);
      } else {
        CHECK(a.launch.dynamic_smem <= b.launch.dynamic_smem);
      }
    }
  }
}

TEST_CASE("verify_attention[kv=e4m3]: K rows are one byte an element, padded to whole swizzle groups") {
  VerifySpec mla;
  mla.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  VerifyTiles t;
  t.kernel = VerifyKernel::qsplit;
  t.block_m = 64;
  t.block_n = 16;
  t.warps = 8;
  t.stages = 4;
  t.warp_rows = 32;
  const QsplitSmemLayout l = qsplit_smem_layout(mla, t);
  CHECK(l.part_s == 4 * 16 * 640);  // 576 bytes a token at a stride of 40 chunks
  // qsplit's e4m3 MMA path packs them (36 chunks): four 32-token stages, the three
  // quarters each warp hands on, e4m3 P, Q's e4m3 rows and scales staged at 0.
  t.block_n = 32;
  t.mma_e4m3 = true;
  const QsplitSmemLayout p = qsplit_smem_layout(mla, t);
  CHECK(p.part_s == 4 * 32 * 576);
  CHECK(p.p == p.part_s + 8 * 3 * 8 * 32 * 4);
  CHECK(p.stats == p.p + 64 * 32);
  CHECK(p.q_scale == 64 * 576);
  CHECK(p.walk == p.stats + KDTREE_QSPLIT_STATS * 64 * 4);
  CHECK(p.walk >= p.q_scale + 64 * 4);
  CHECK(p.bytes <= arch_from_sm(120).max_smem_per_block);
  CHECK(generate_verify_attention(mla, arch_from_sm(120), t).source.find("#define KD_KV_ROWS_PACKED true") !=
        std::string::npos);
  VerifySpec gqa64 = mla;
  gqa64.head_dim_qk = gqa64.head_dim_v = 64;
  VerifyTiles g;
  g.block_m = 64;
  g.block_n = 64;
  g.warps = 4;
  g.stages = 2;
  g.warp_rows = 16;
  const FlashSmemLayout f = flash_smem_layout(gqa64, g);
  CHECK(f.v - f.k == 2 * 64 * 64);  // 4 chunks a row, unpadded
}

TEST_CASE("verify_attention[kv=e4m3]: every head compiles for sm_80, sm_90 and sm_120 without spills") {
  for (int sm : {80, 90, 120}) {
    const fs::path dir =
        fs::temp_directory_path() / ("kdtree-kv-fp8-" + std::to_string(sm) + "-" + std::to_string(::getpid()));
    auto rt = kdtree::Engine::offline(sm, dir.string());
    for (const HeadShape& h : supported_heads()) {
      for (int w : {16, 128}) {  // one and two mask words
        VerifySpec s = spec_of(h, KDTREE_KV_DTYPE_E4M3);
        s.max_tree_nodes = w;
        s.page_size = 16;
        INFO(s.label() << " for sm_" << sm);
        const KernelSource src = generate_verify_attention(s, rt->arch());
        const auto m = rt->compile(src);
        for (const auto& [entry, use] : m->usage) {
          INFO(entry << ": " << use.registers << " registers");
          CHECK(use.spill_stores == 0);
          CHECK(use.spill_loads == 0);
        }
      }
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("verify_attention[kv=e4m3,mma=e4m3]: sm_120 and sm_90 sources differ in the MMA form alone") {
  // One kernel source: sm_120 compiles it for sm_120a with the block-scaled MMA, sm_90
  // (and sm_89) with the plain e4m3 MMA; with the same tiles every other line is equal.
  for (const HeadShape& h : supported_heads()) {
    const VerifySpec s = spec_of(h, KDTREE_KV_DTYPE_E4M3);
    const VerifyTiles tiles = choose_verify_tiles(s, arch_from_sm(120));
    INFO(s.label() << " " << tiles.str());
    REQUIRE(tiles.mma_e4m3);
    const KernelSource a = generate_verify_attention(s, arch_from_sm(120), tiles);
    const KernelSource b = generate_verify_attention(s, arch_from_sm(90), tiles);
    CHECK(a.arch_specific);
    CHECK_FALSE(b.arch_specific);
    CHECK(a.headers == b.headers);
    const std::string flat_a = flatten(a), flat_b = flatten(b);
    std::vector<std::string> differ;
    size_t ia = 0, ib = 0;
    while (ia < flat_a.size() || ib < flat_b.size()) {
      const size_t ea = flat_a.find('\n', ia), eb = flat_b.find('\n', ib);
      const std::string la = flat_a.substr(ia, ea - ia), lb = flat_b.substr(ib, eb - ib);
      if (la != lb) differ.push_back(la + " | " + lb);
      ia = ea == std::string::npos ? flat_a.size() : ea + 1;
      ib = eb == std::string::npos ? flat_b.size() : eb + 1;
    }
    REQUIRE(differ.size() == 1);
    CHECK(differ[0] == "#define KD_MMA_BLOCK_SCALED true | #define KD_MMA_BLOCK_SCALED false");
  }
}

TEST_CASE(
    "verify_attention[kv=e4m3]: sm_120/sm_121 choose the e4m3 MMA path, sm_90's MLA the native e4m3 wgmma, the other "
    "arches dequantise") {
  for (const HeadShape& h : supported_heads()) {
    const VerifySpec s = spec_of(h, KDTREE_KV_DTYPE_E4M3);
    for (int sm : supported_sms()) {
      const VerifyTiles t = choose_verify_tiles(s, arch_from_sm(sm));
      INFO(s.label() << " sm_" << sm << ": " << t.str());
      const bool wgmma = sm == 90 && h.mla;
      CHECK(t.mma_e4m3 == (sm == 120 || sm == 121 || wgmma));
      // MLA: Q in registers (qsplit), on sm_90 wgmma; GQA: flash.
      if (t.mma_e4m3) {
        CHECK(t.kernel == (wgmma ? VerifyKernel::wgmma : h.mla ? VerifyKernel::qsplit : VerifyKernel::flash));
      }
    }
    // 16-bit caches never take it.
    CHECK_FALSE(choose_verify_tiles(spec_of(h, KDTREE_KV_DTYPE_AS_Q), arch_from_sm(120)).mma_e4m3);
  }
  // MLA on sm_120: the qsplit kernel's e4m3 MMA path (tools/perf_model: 1.26-1.47x
  // the flash one on the compute-bound bench shapes).
  const VerifyTiles mla120 =
      choose_verify_tiles(spec_of(supported_heads()[0], KDTREE_KV_DTYPE_E4M3), arch_from_sm(120));
  CHECK(mla120.str() == "kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3");
  CHECK(verify_smem_bytes(spec_of(supported_heads()[0], KDTREE_KV_DTYPE_E4M3), mla120) <=
        arch_from_sm(120).max_smem_per_block);
  // The flash e4m3 MLA kernel: its e4m3 Q tile (64 x 640 bytes) fits 99 KB too.
  const VerifyTiles flash120 =
      parse_verify_tiles("kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=16,mma=e4m3",
                         spec_of(supported_heads()[0], KDTREE_KV_DTYPE_E4M3), arch_from_sm(120));
  const FlashSmemLayout l = flash_smem_layout(spec_of(supported_heads()[0], KDTREE_KV_DTYPE_E4M3), flash120);
  CHECK(l.q_scale == 64 * 640);
  CHECK(l.k == l.q_scale + 64 * 4);
  CHECK(l.red == l.p + 64 * 32);  // P as e4m3 codes
  CHECK(l.bytes <= arch_from_sm(120).max_smem_per_block);
}

TEST_CASE("KDTREE_VERIFY_TILES mma=: e4m3 or 16bit, and mma=e4m3 only where it runs") {
  const VerifySpec fp8 = spec_of(supported_heads()[0], KDTREE_KV_DTYPE_E4M3);
  const VerifySpec bf16 = spec_of(supported_heads()[0], KDTREE_KV_DTYPE_AS_Q);
  auto refused = [](const std::string& text, const VerifySpec& s, int sm, const std::string& why) {
    INFO(text << " sm_" << sm);
    try {
      parse_verify_tiles(text, s, arch_from_sm(sm));
      FAIL("accepted");
    } catch (const kdtree::Error& e) {
      INFO(e.what());
      CHECK(e.status() == KDTREE_ERROR_INVALID_ARGUMENT);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  CHECK(parse_verify_tiles("mma=e4m3", fp8, arch_from_sm(90)).mma_e4m3);
  // sm_90's MLA kernel over e4m3 caches is the native e4m3 wgmma; the dequantising path is flash's.
  refused("mma=16bit", fp8, 90, "kernel=flash");
  CHECK_FALSE(parse_verify_tiles("kernel=flash,stages=2,mma=16bit", fp8, arch_from_sm(90)).mma_e4m3);
  // Another family named without mma takes the form the generator gives it there: on sm_90 flash and qsplit
  // dequantise, on sm_120 they take the e4m3 MMA path.
  CHECK_FALSE(
      parse_verify_tiles("kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32", fp8, arch_from_sm(90))
          .mma_e4m3);
  CHECK_FALSE(
      parse_verify_tiles("kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32", fp8, arch_from_sm(90))
          .mma_e4m3);
  CHECK(parse_verify_tiles("kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=16", fp8, arch_from_sm(120))
            .mma_e4m3);
  // sm_120's MLA dequantising kernel is qsplit: a 16-bit Q tile does not fit flash there.
  CHECK_FALSE(parse_verify_tiles("mma=16bit,kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32", fp8,
                                 arch_from_sm(120))
                  .mma_e4m3);
  // sm_120's MLA e4m3 tiles are qsplit's 32-token ones, which its 16-bit path does not take.
  refused("mma=16bit", fp8, 120, "block_n 16");
  refused("mma=16bit,kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=16", fp8, 120, "do not fit sm_120");
  CHECK(parse_verify_tiles("mma=e4m3", fp8, arch_from_sm(90)).str().find(",mma=e4m3") != std::string::npos);
  refused("mma=fp8", fp8, 90, "mma 'fp8' must be 16bit or e4m3");
  refused("mma=e4m3", bf16, 90, "kv_dtype is not e4m3");
  refused("mma=e4m3", fp8, 80, "sm_89 and newer");
  refused("mma=e4m3,block_n=16,kernel=flash", fp8, 90, "multiple of 32");
  // qsplit's e4m3 MMA path: 32-token tiles of 2 x 4 warps of 32 rows, three stages or more.
  const char* q8 = "kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3";
  CHECK(parse_verify_tiles(q8, fp8, arch_from_sm(120)).str() == q8);
  CHECK(parse_verify_tiles(q8, fp8, arch_from_sm(90)).str() == q8);  // how the H200 tests it
  CHECK(parse_verify_tiles("kernel=qsplit,block_m=64,block_n=32,warps=8,stages=3,warp_rows=32,mma=e4m3", fp8,
                           arch_from_sm(120))
            .mma_e4m3);
  refused("mma=e4m3,kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32", fp8, 120, "multiple of 32");
  refused("mma=e4m3,kernel=qsplit,block_m=64,block_n=64,warps=8,stages=3,warp_rows=32", fp8, 90, "block_n 32");
  refused("mma=e4m3,kernel=qsplit,block_m=64,block_n=32,warps=8,stages=2,warp_rows=32", fp8, 120, "stages >= 3");
  refused("mma=e4m3,kernel=qsplit,block_m=32,block_n=32,warps=4,stages=4,warp_rows=16", fp8, 120, "warp_rows 32");
  refused("mma=e4m3,kernel=qsplit,block_m=64,block_n=32,warps=8,stages=5,warp_rows=32", fp8, 120, "do not fit sm_120");
  refused(q8, bf16, 120, "kv_dtype is not e4m3");
  refused(q8, fp8, 80, "sm_89 and newer");
}
