// verify_plan: the launch plan of every bench_verify shape for an arch, computed by
// the runtime's own planner (no GPU needed), and optionally the kernels' cubins.
// The performance model (tools/perf_model) reads this, so its CTA counts, splits
// and tiles are the runtime's, not a copy of its logic.
//
// usage: verify_plan --arch sm_120|sm_90|sm_80 [--cubin-dir DIR] [--cache-dir DIR] [--shape PREFIX]
//                    [--compile-arch ARCH] [--splits N] [--kv-dtype as_q|e4m3] [--grid [-j N]]
//   One JSON object per line and shape. KDTREE_VERIFY_TILES applies as in the
//   runtime. With --cubin-dir, each shape's kernel is compiled (or read from the
//   cache) and written as DIR/<kernel>.cubin with its ptxas log in <kernel>.log.
//   --compile-arch compiles the --arch kernels (its tiles) for another arch: a
//   what-if for the model (e.g. sm_90's tiles in sm_120 code), never launched.
//   --splits forces the KV split count as kdtree_verify_args.num_splits does.
//   --kv-dtype: the shapes' KV cache type (default as_q); e4m3 fails (UNSUPPORTED,
//   naming kv_dtype) while this build does not generate e4m3 kernels.
//   --grid [-j N]: instead of the shapes, every verify_attention kernel of the default
//   grid (codegen/grid.hpp: heads x widths x page sizes x dtypes), one JSON object
//   each, compiled on N threads when --cubin-dir is given.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/grid.hpp"
#include "codegen/verify_attention.hpp"
#include "runtime/runtime.hpp"
#include "runtime/verify_attention.hpp"
#include "verify_shapes.hpp"

namespace {

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// The name a kernel's cubin and JSON line carry: its file stem, arch, family and tiles.
std::string kernel_name(const std::string& stem, const std::string& arch, const kdtree::codegen::VerifyTiles& t) {
  return fmt::format("{}-{}-{}_{}_{}_{}_{}_{}", stem, arch, kdtree::codegen::kernel_name(t.kernel), t.block_m,
                     t.block_n, t.warps, t.stages, t.warp_rows);
}

void write_module(const kdtree::CompiledModule& m, const std::string& dir, const std::string& kernel) {
  std::ofstream(dir + "/" + kernel + ".cubin", std::ios::binary)
      .write(m.cubin.data(), static_cast<std::streamsize>(m.cubin.size()));
  std::ofstream(dir + "/" + kernel + ".log") << m.ptxas_log;
}

// Every verify_attention kernel of the default grid for the arch.
int run_grid(kdtree::Engine& rt, const std::string& cubin_dir, int jobs) {
  const kdtree::codegen::Arch& arch = rt.arch();
  struct Item {
    kdtree::codegen::VerifySpec spec;
    kdtree::codegen::VerifyTiles tiles;
    kdtree::codegen::KernelSource source;  // generated with `tiles`, so the cubin is the kernel named
    std::string kernel;
  };
  std::vector<Item> items;
  const kdtree::codegen::GridOptions grid;
  for (const std::string& head : grid.heads)
    for (int width : grid.widths)
      for (int page : grid.page_sizes)
        for (kdtree_dtype dtype : grid.dtypes)
          for (kdtree_kv_dtype kv_dtype : grid.kv_dtypes) {
            Item it;
            kdtree::codegen::parse_head_name(head, &it.spec.head_dim_qk, &it.spec.head_dim_v);
            it.spec.max_tree_nodes = width;
            it.spec.page_size = page;
            it.spec.dtype = dtype;
            it.spec.kv_dtype = kv_dtype;
            it.tiles = kdtree::codegen::choose_verify_tiles(it.spec, arch);
            it.source = kdtree::codegen::generate_verify_attention(it.spec, arch, it.tiles);
            it.kernel = kernel_name(it.source.file_stem, arch.name(), it.tiles);
            items.push_back(it);
          }
  if (!cubin_dir.empty()) {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    auto worker = [&] {
      for (size_t i; (i = next++) < items.size();) {
        try {
          write_module(*rt.compile(items[i].source), cubin_dir, items[i].kernel);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "verify_plan: %s: %s\n", items[i].kernel.c_str(), e.what());
          failed = true;
        }
      }
    };
    std::vector<std::thread> pool;
    for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
    worker();
    for (std::thread& th : pool) th.join();
    if (failed) return 1;
  }
  for (const Item& it : items) {
    const kdtree::codegen::VerifyTiles& t = it.tiles;
    std::printf(
        "{\"arch\":\"%s\",\"head_qk\":%d,\"head_v\":%d,\"width\":%d,\"page\":%d,\"dtype\":\"%s\",\"kv_dtype\":\"%s\","
        "\"family\":\"%s\",\"tiles\":\"%s\",\"block_m\":%d,\"block_n\":%d,\"warps\":%d,\"stages\":%d,"
        "\"warp_rows\":%d,\"smem\":%d,\"cluster_merge\":%s,\"kernel\":\"%s\"}\n",
        arch.name().c_str(), it.spec.head_dim_qk, it.spec.head_dim_v, it.spec.max_tree_nodes, it.spec.page_size,
        kdtree::codegen::dtype_name(it.spec.dtype), kdtree::codegen::kv_dtype_name(it.spec.kv_dtype),
        kdtree::codegen::kernel_name(t.kernel), t.str().c_str(), t.block_m, t.block_n, t.warps, t.stages, t.warp_rows,
        kdtree::codegen::verify_smem_bytes(it.spec, t), it.source.launch.cluster_merge ? "true" : "false",
        it.kernel.c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
  std::string arch_name, cubin_dir, cache_dir, only, compile_arch, splits_text, jobs_text = "1", kv_text = "as_q";
  bool grid = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf(
          "usage: verify_plan --arch sm_120|sm_90|sm_80 [--cubin-dir DIR] [--cache-dir DIR] [--shape PREFIX] "
          "[--compile-arch ARCH] [--splits N] [--kv-dtype as_q|e4m3] [--grid [-j N]]\n");
      return 0;
    }
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) kdtree::fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("{} needs a value", argv[i]));
      *out = argv[++i];
    };
    if (!std::strcmp(argv[i], "--arch"))
      value(&arch_name);
    else if (!std::strcmp(argv[i], "--cubin-dir"))
      value(&cubin_dir);
    else if (!std::strcmp(argv[i], "--cache-dir"))
      value(&cache_dir);
    else if (!std::strcmp(argv[i], "--shape"))
      value(&only);
    else if (!std::strcmp(argv[i], "--compile-arch"))
      value(&compile_arch);
    else if (!std::strcmp(argv[i], "--splits"))
      value(&splits_text);
    else if (!std::strcmp(argv[i], "--kv-dtype"))
      value(&kv_text);
    else if (!std::strcmp(argv[i], "--grid"))
      grid = true;
    else if (!std::strcmp(argv[i], "-j"))
      value(&jobs_text);
    else
      kdtree::fail(KDTREE_ERROR_INVALID_ARGUMENT, fmt::format("unknown argument '{}'", argv[i]));
  }
  if (arch_name.empty()) kdtree::fail(KDTREE_ERROR_INVALID_ARGUMENT, "--arch is required (sm_120, sm_90, sm_80)");
  const kdtree_kv_dtype kv_dtype = kdtree::codegen::parse_kv_dtype(kv_text);
  auto rt = kdtree::Engine::offline(kdtree::codegen::parse_arch(arch_name).sm, cache_dir);
  const kdtree::codegen::Arch& arch = rt->arch();
  if (grid) return run_grid(*rt, cubin_dir, std::max(1, std::stoi(jobs_text)));
  auto compiler =
      compile_arch.empty() ? nullptr : kdtree::Engine::offline(kdtree::codegen::parse_arch(compile_arch).sm, cache_dir);
  for (const kdtree::bench::VerifyShape& s : kdtree::bench::kVerifyShapes) {
    if (!only.empty() && std::strncmp(only.c_str(), s.name, only.size())) continue;
    const int width = kdtree::bench::verify_width(s.nodes);
    kdtree_verify_spec spec{s.head_qk, s.head_v, s.q_heads, s.kv_heads, s.page, width, KDTREE_DTYPE_BF16, kv_dtype};
    const int total_nodes = s.nodes * s.batch;
    const int kv_len = s.prefix + s.nodes;
    const int forced = splits_text.empty() ? 0 : std::stoi(splits_text);
    const kdtree::codegen::VerifySpec vspec = kdtree::codegen::validate_verify_spec(spec);
    // The runtime's tiles (KDTREE_VERIFY_TILES applies) and its generated source and plan.
    const kdtree::codegen::VerifyTiles t = kdtree::codegen::verify_tiles(vspec, arch);
    const kdtree::codegen::KernelSource source = kdtree::codegen::generate_verify_attention(vspec, arch, t);
    kdtree::check_verify_sizes(spec, width, s.batch, total_nodes, kv_len, forced);
    const kdtree::VerifyPlan plan =
        kdtree::plan_verify(source.launch, arch, spec, s.batch, total_nodes, kv_len, forced);
    const int group = s.q_heads / s.kv_heads;
    // The CTAs along x that have rows (the rest of plan.grid_x exits at once).
    const long long active_x = ceil_div((long long)s.nodes * group, t.block_m);
    const std::string kernel = kernel_name(source.file_stem, compiler ? compiler->arch().name() : arch.name(), t);
    if (!cubin_dir.empty()) {
      write_module(*(compiler ? *compiler : *rt).compile(source), cubin_dir, kernel);
    }
    std::printf(
        "{\"shape\":\"%s\",\"arch\":\"%s\",\"num_sms\":%d,\"max_smem_per_sm\":%d,\"batch\":%d,\"q_heads\":%d,"
        "\"kv_heads\":%d,\"nodes\":%d,\"kv_len\":%d,\"head_qk\":%d,\"head_v\":%d,\"page\":%d,\"width\":%d,"
        "\"family\":\"%s\",\"tiles\":\"%s\",\"block_m\":%d,\"block_n\":%d,\"warps\":%d,\"stages\":%d,"
        "\"warp_rows\":%d,\"warps_n\":%d,\"smem\":%d,\"ctas_per_sm\":%d,"
        "\"splits\":%d,\"stream_ctas\":%d,\"cluster_splits\":%d,\"cluster_merge\":%s,\"split_tokens\":%d,\"grid\":[%u,%"
        "u,%d],\"active_x\":%lld,\"combine_grid\":[%"
        "u,%u],"
        "\"kernel\":\"%s\",\"kv_dtype\":\"%s\"}\n",
        s.name, arch.name().c_str(), arch.num_sms, arch.max_smem_per_sm, s.batch, s.q_heads, s.kv_heads, s.nodes,
        kv_len, s.head_qk, s.head_v, s.page, width, kdtree::codegen::kernel_name(t.kernel), t.str().c_str(), t.block_m,
        t.block_n, t.warps, t.stages, t.warp_rows, t.warps_n(), source.launch.dynamic_smem,
        kdtree::codegen::ctas_per_sm(arch, source.launch.dynamic_smem, source.launch.threads), plan.num_splits,
        plan.stream_ctas, plan.cluster_splits, source.launch.cluster_merge ? "true" : "false", plan.split_tokens,
        plan.grid_x, plan.grid_y, plan.grid_z, active_x, plan.combine_grid_x, plan.combine_grid_y, kernel.c_str(),
        kdtree::codegen::kv_dtype_name(kv_dtype));
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
