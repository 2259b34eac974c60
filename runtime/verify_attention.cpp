#include "runtime/verify_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "codegen/verify_attention.hpp"
#include "runtime/arg_checks.hpp"
#include "runtime/c_api.hpp"
#include "verify_attention_params.h"

namespace kdtree {
namespace {

int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

Module& verify_module(Runtime& rt, const codegen::VerifySpec& spec) {
  return rt.module(spec.fast_key(), [&] { return codegen::generate_verify_attention(spec, rt.arch()); });
}

}  // namespace

size_t verify_workspace_bytes(const kdtree_verify_spec& s, int total_nodes, int num_splits) {
  if (num_splits <= 1) return 0;
  return size_t(num_splits) * size_t(total_nodes) * s.num_q_heads * (s.head_dim_v + 1) * sizeof(float);
}

VerifyPlan plan_verify(Runtime& rt, const kdtree_verify_spec& s, int batch_size, int total_nodes, int max_kv_len,
                       int forced_splits) {
  codegen::VerifySpec spec = codegen::validate_verify_spec(s);
  require(batch_size >= 1, "batch_size {} must be >= 1", batch_size);
  require(total_nodes >= batch_size && total_nodes <= (long long)batch_size * spec.max_tree_nodes, "total_nodes {} is out of range: each of the {} requests has 1..{} (max_tree_nodes) nodes",
                      total_nodes, batch_size, spec.max_tree_nodes);
  require(max_kv_len >= 1, "max_kv_len {} must be >= 1", max_kv_len);
  require(forced_splits >= 0, "num_splits {} must be >= 0", forced_splits);
  const codegen::Arch& arch = rt.arch();
  codegen::VerifyTiles tiles = codegen::choose_verify_tiles(spec, arch);
  const int group = s.num_q_heads / s.num_kv_heads;
  const int kv_tiles = ceil_div(max_kv_len, tiles.block_n);
  int splits = forced_splits;
  if (splits == 0) {
    // Model the time as waves x KV tiles per CTA: a CTA streams ceil(kv_tiles / s)
    // tiles plus about one tile's worth of fixed work (Q load, pipeline fill, and
    // the combine when s > 1); CTAs run ctas_per_sm at a time on every SM. The
    // cheapest s wins (the fewest on a tie), so small batches spread the KV over
    // the whole GPU and large ones are not cut into a partial last wave.
    const long long ctas = std::max<long long>(ceil_div((long long)total_nodes * group, tiles.block_m),
                                               batch_size) * s.num_kv_heads;
    const int threads = tiles.warps * 32;
    const int ctas_per_sm = std::max(1, std::min(arch.max_smem_per_sm / (tiles.smem_bytes + 1024),
                                                 65536 / (threads * 240)));
    const long long slots = (long long)arch.num_sms * ctas_per_sm;
    double best = 0;
    for (int cand = 1; cand <= std::min(64, kv_tiles); ++cand) {
      double waves = std::ceil(double(ctas * cand) / slots);
      double cost = waves * (ceil_div(kv_tiles, cand) + (cand > 1 ? 1.5 : 1.0));
      if (cand == 1 || cost < best) {
        best = cost;
        splits = cand;
      }
    }
    splits = ceil_div(kv_tiles, ceil_div(kv_tiles, splits));  // no empty trailing split
  }
  VerifyPlan plan;
  plan.tiles = tiles;
  plan.num_splits = splits;
  plan.split_tokens = ceil_div(kv_tiles, splits) * tiles.block_n;
  plan.workspace_bytes = verify_workspace_bytes(s, total_nodes, splits);
  return plan;
}

void verify_attention(Runtime& rt, const kdtree_verify_args& a) {
  codegen::VerifySpec spec = codegen::validate_verify_spec(a.spec);
  // 16-byte cp.async rows for q and the caches; 4-byte stores of out.
  require_buffer(a.q, 16, "q");
  require_buffer(a.node_indptr, 4, "node_indptr");
  require_buffer(a.k_cache, 16, "k_cache");
  require_buffer(a.page_table, 4, "page_table");
  require_buffer(a.kv_lens, 4, "kv_lens");
  require_buffer(a.tree_mask, 8, "tree_mask");
  require_buffer(a.out, 4, "out");
  require_optional_buffer(a.lse, 4, "lse");
  if (spec.mla()) {
    require(a.v_cache == nullptr, "v_cache must be NULL for MLA (V is the first head_dim_v dims of the k_cache row)");
  } else {
    require_buffer(a.v_cache, 16, "v_cache");
  }
  require(a.num_pages >= 1, "num_pages {} must be >= 1", a.num_pages);
  require(a.max_pages_per_req >= 1, "max_pages_per_req {} must be >= 1", a.max_pages_per_req);
  // Positive: the kernel takes row maxima of the raw scores and scales them once.
  require(std::isfinite(a.sm_scale) && a.sm_scale > 0.0f, "sm_scale {} must be positive and finite (e.g. 1/sqrt(head_dim_qk))",
          a.sm_scale);
  auto check_workspace = [&](size_t needed) {
    require(needed == 0 || (a.workspace != nullptr && a.workspace_size >= needed), "workspace too small: {} bytes given, {} needed (kdtree_verify_workspace_size)",
                        a.workspace ? a.workspace_size : 0, needed);
  };
  // A forced split count fixes the workspace without asking the device.
  if (a.num_splits > 0) check_workspace(verify_workspace_bytes(a.spec, a.total_nodes, a.num_splits));
  VerifyPlan plan = plan_verify(rt, a.spec, a.batch_size, a.total_nodes, a.max_kv_len, a.num_splits);
  check_workspace(plan.workspace_bytes);

  const codegen::VerifyTiles& tiles = plan.tiles;
  Module& module = verify_module(rt, spec);

  kdtree_verify_params p{};
  p.q = a.q;
  p.k_cache = a.k_cache;
  p.v_cache = spec.mla() ? a.k_cache : a.v_cache;
  p.node_indptr = a.node_indptr;
  p.page_table = a.page_table;
  p.kv_lens = a.kv_lens;
  p.tree_mask = reinterpret_cast<const unsigned long long*>(a.tree_mask);
  p.out = a.out;
  p.lse = a.lse;
  p.error_flags = a.error_flags;
  p.batch_size = a.batch_size;
  p.total_nodes = a.total_nodes;
  p.num_q_heads = a.spec.num_q_heads;
  p.num_kv_heads = a.spec.num_kv_heads;
  p.group = a.spec.num_q_heads / a.spec.num_kv_heads;
  p.max_pages_per_req = a.max_pages_per_req;
  p.num_pages = a.num_pages;
  p.max_kv_len = a.max_kv_len;
  p.num_splits = plan.num_splits;
  p.split_tokens = plan.split_tokens;
  p.scale_log2 = a.sm_scale * 1.4426950408889634f;
  if (plan.num_splits > 1) {
    size_t rows = static_cast<size_t>(a.total_nodes) * a.spec.num_q_heads;
    p.partial_o = static_cast<float*>(a.workspace);
    p.partial_lse = p.partial_o + plan.num_splits * rows * spec.head_dim_v;
  }
  void* args[] = {&p};
  CUstream stream = static_cast<CUstream>(a.stream);

  LaunchDims main;
  main.grid_x = ceil_div((long long)spec.max_tree_nodes * p.group, tiles.block_m);
  main.grid_y = a.batch_size * a.spec.num_kv_heads;
  main.grid_z = plan.num_splits;
  main.block_x = tiles.warps * 32;
  main.dynamic_smem = tiles.smem_bytes;
  rt.launch(module.function("kdtree_verify_attention", tiles.smem_bytes), main, args, stream,
            "launching kdtree_verify_attention");
  if (plan.num_splits > 1) {
    LaunchDims combine;
    // Mirrors COMBINE_ROWS of the template: 128 threads, head_dim_v / 4 per row.
    const int rows_per_cta = std::max(1, 128 / (spec.head_dim_v / 4));
    combine.grid_x = ceil_div((long long)a.total_nodes * a.spec.num_q_heads, rows_per_cta);
    combine.block_x = 128;
    rt.launch(module.function("kdtree_verify_combine"), combine, args, stream, "launching kdtree_verify_combine");
  }
}

}  // namespace kdtree

using kdtree::guarded;
using kdtree::require;

extern "C" {

kdtree_status kdtree_verify_workspace_size(kdtree_runtime* rt, const kdtree_verify_spec* spec, int batch_size,
                                           int total_nodes, int max_kv_len, size_t* bytes) {
  return guarded("kdtree_verify_workspace_size", [&] {
    require(spec != nullptr, "spec is NULL");
    require(bytes != nullptr, "bytes is NULL");
    *bytes = kdtree::plan_verify(kdtree::unwrap(rt), *spec, batch_size, total_nodes, max_kv_len, 0).workspace_bytes;
  });
}

kdtree_status kdtree_verify_attention(kdtree_runtime* rt, const kdtree_verify_args* args) {
  return guarded("kdtree_verify_attention", [&] {
    require(args != nullptr, "args is NULL");
    kdtree::verify_attention(kdtree::unwrap(rt), *args);
  });
}

kdtree_status kdtree_warm(kdtree_runtime* rt, const kdtree_verify_spec* spec) {
  return guarded("kdtree_warm", [&] {
    require(spec != nullptr, "spec is NULL");
    kdtree::Runtime& r = kdtree::unwrap(rt);
    kdtree::codegen::VerifySpec v = kdtree::codegen::validate_verify_spec(*spec);
    if (r.has_device()) {
      kdtree::verify_module(r, v);
    } else {
      r.compile(kdtree::codegen::generate_verify_attention(v, r.arch()));
    }
  });
}

}  // extern "C"
