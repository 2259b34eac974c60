// verify_plan: the launch plan of every bench_verify shape for an arch, computed by
// the runtime's own planner (no GPU needed), and optionally the kernels' cubins.
// The performance model (tools/perf_model) reads this, so its CTA counts, splits
// and tiles are the runtime's, not a copy of its logic.
//
// usage: verify_plan --arch sm_120|sm_90|sm_80 [--cubin-dir DIR] [--cache-dir DIR] [--shape PREFIX]
//                    [--compile-arch ARCH]
//   One JSON object per line and shape. KDTREE_VERIFY_TILES applies as in the
//   runtime. With --cubin-dir, each shape's kernel is compiled (or read from the
//   cache) and written as DIR/<kernel>.cubin with its ptxas log in <kernel>.log.
//   --compile-arch compiles the --arch kernels (its tiles) for another arch: a
//   what-if for the model (e.g. sm_90's tiles in sm_120 code), never launched.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "codegen/verify_attention.hpp"
#include "runtime/error.hpp"
#include "runtime/runtime.hpp"
#include "runtime/verify_attention.hpp"
#include "verify_shapes.hpp"

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

int run(int argc, char** argv) {
  std::string arch_name, cubin_dir, cache_dir, only, compile_arch;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: verify_plan --arch sm_120|sm_90|sm_80 [--cubin-dir DIR] [--cache-dir DIR] [--shape PREFIX] "
                  "[--compile-arch ARCH]\n");
      return 0;
    }
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) kdtree::fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("{} needs a value", argv[i]));
      *out = argv[++i];
    };
    if (!std::strcmp(argv[i], "--arch")) value(&arch_name);
    else if (!std::strcmp(argv[i], "--cubin-dir")) value(&cubin_dir);
    else if (!std::strcmp(argv[i], "--cache-dir")) value(&cache_dir);
    else if (!std::strcmp(argv[i], "--shape")) value(&only);
    else if (!std::strcmp(argv[i], "--compile-arch")) value(&compile_arch);
    else kdtree::fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("unknown argument '{}'", argv[i]));
  }
  if (arch_name.empty()) kdtree::fail(KDTREE_ERROR_INVALID_ARGUMENT, "--arch is required (sm_120, sm_90, sm_80)");
  auto rt = kdtree::Runtime::offline(kdtree::codegen::parse_arch(arch_name).sm, cache_dir);
  const kdtree::codegen::Arch& arch = rt->arch();
  auto compiler = compile_arch.empty() ? nullptr
                                       : kdtree::Runtime::offline(kdtree::codegen::parse_arch(compile_arch).sm, cache_dir);
  for (const kdtree::bench::VerifyShape& s : kdtree::bench::kVerifyShapes) {
    if (!only.empty() && std::strncmp(only.c_str(), s.name, only.size())) continue;
    const int width = kdtree::bench::verify_width(s.nodes);
    kdtree_verify_spec spec{s.head_qk, s.head_v, s.q_heads, s.kv_heads, s.page, width, KDTREE_DTYPE_BF16};
    const int total_nodes = s.nodes * s.batch;
    const int kv_len = s.prefix + s.nodes;
    const kdtree::VerifyPlan plan = kdtree::plan_verify(*rt, spec, s.batch, total_nodes, kv_len, 0);
    const kdtree::codegen::VerifyTiles& t = plan.tiles;
    const kdtree::codegen::VerifySpec vspec = kdtree::codegen::validate_verify_spec(spec);
    const kdtree::codegen::KernelSource source = kdtree::codegen::generate_verify_attention(vspec, arch);
    const int group = s.q_heads / s.kv_heads;
    // The grids runtime/verify_attention.cpp launches: x covers max_tree_nodes rows
    // (CTAs past a request's rows exit at once); the combine is 128 threads.
    const long long grid_x = ceil_div((long long)width * group, t.block_m);
    const long long active_x = ceil_div((long long)s.nodes * group, t.block_m);
    const long long combine_rows = std::max(1, 128 / (s.head_v / 4));
    const long long combine_ctas = plan.num_splits > 1 ? ceil_div((long long)total_nodes * s.q_heads, combine_rows) : 0;
    std::string kernel = fmt::format("{}-{}-{}_{}_{}_{}_{}", source.file_stem,
                                     compiler ? compiler->arch().name() : arch.name(), t.block_m, t.block_n, t.warps,
                                     t.stages, t.warp_rows);
    if (!cubin_dir.empty()) {
      auto module = (compiler ? *compiler : *rt).compile(source);
      std::ofstream(cubin_dir + "/" + kernel + ".cubin", std::ios::binary)
          .write(module->cubin.data(), static_cast<std::streamsize>(module->cubin.size()));
      std::ofstream(cubin_dir + "/" + kernel + ".log") << module->ptxas_log;
    }
    std::printf(
        "{\"shape\":\"%s\",\"arch\":\"%s\",\"num_sms\":%d,\"max_smem_per_sm\":%d,\"batch\":%d,\"q_heads\":%d,"
        "\"kv_heads\":%d,\"nodes\":%d,\"kv_len\":%d,\"head_qk\":%d,\"head_v\":%d,\"page\":%d,\"width\":%d,"
        "\"block_m\":%d,\"block_n\":%d,\"warps\":%d,\"stages\":%d,\"warp_rows\":%d,\"warps_n\":%d,\"smem\":%d,"
        "\"splits\":%d,\"split_tokens\":%d,\"grid\":[%lld,%d,%d],\"active_x\":%lld,\"combine_ctas\":%lld,"
        "\"kernel\":\"%s\"}\n",
        s.name, arch.name().c_str(), arch.num_sms, arch.max_smem_per_sm, s.batch, s.q_heads, s.kv_heads, s.nodes,
        kv_len, s.head_qk, s.head_v, s.page, width, t.block_m, t.block_n, t.warps, t.stages, t.warp_rows,
        t.warps_n(), t.smem_bytes, plan.num_splits, plan.split_tokens, grid_x, s.batch * s.kv_heads,
        plan.num_splits, active_x, combine_ctas, kernel.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verify_plan: %s\n", e.what());
    return 2;
  }
}
