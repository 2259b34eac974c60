// verify_attention with e4m3 KV caches: one kernel source per family, the cache
// dtype a compile-time switch; fp8 rows in shared memory (half the bytes), and
// every head compiles without spills for sm_80, sm_90 and sm_120.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <unistd.h>

#include "codegen/verify_attention.hpp"
#include "runtime/runtime.hpp"

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
      const KernelSource a = generate_verify_attention(fp8, arch, tiles);
      const KernelSource b = generate_verify_attention(bf16, arch, tiles);
      CHECK(a.label == b.label.substr(0, b.label.size() - 1) + ",kv=e4m3]");
      CHECK(a.file_stem == b.file_stem + "-kv_e4m3");
      std::string sa = a.source, sb = b.source;
      const std::string on = "#define KD_KV_FP8 true\n", off = "#define KD_KV_FP8 false\n";
      REQUIRE(sa.find(on) != std::string::npos);
      REQUIRE(sb.find(off) != std::string::npos);
      sa.replace(sa.find(on), on.size(), off);
      // The shared-memory offsets differ (fp8 stages are half the bytes); the rest is the same text.
      auto strip_smem = [](std::string s) {
        std::string out;
        for (size_t at = 0; at < s.size();) {
          const size_t end = s.find('\n', at);
          const std::string line = s.substr(at, end - at);
          if (line.rfind("#define KD_SMEM_", 0) != 0) out += line + "\n";
          at = end == std::string::npos ? s.size() : end + 1;
        }
        return out;
      };
      CHECK(strip_smem(sa) == strip_smem(sb));
      CHECK(a.launch.dynamic_smem <= b.launch.dynamic_smem);
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
