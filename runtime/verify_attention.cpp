#include "runtime/verify_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "codegen/verify_attention.hpp"
#include "runtime/arg_checks.hpp"
#include "runtime/driver.hpp"
#include "verify_attention_layout.h"
#include "verify_attention_params.h"
#include "verify_attention_tma.h"

namespace kdtree {
namespace {

// The hardware's limit on a launch's grid y and z.
constexpr long long kMaxGridYZ = 65535;

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// A plan value computed in 64 bits, for a 32-bit kernel parameter: check_verify_sizes'
// bounds keep it in range, so failing here is a kdtree bug, never a silent wrap.
int checked_int(long long v, const char* what) {
  if (v < 0 || v > INT32_MAX) {
    fail(KDTREE_ERROR_INTERNAL, fmt::format("verify_attention plan: {} = {} does not fit 32 bits", what, v));
  }
  return static_cast<int>(v);
}

codegen::KernelSource generate(Engine& rt, const codegen::VerifySpec& spec) {
  return codegen::generate_verify_attention(spec, rt.arch());
}

Module& verify_module(Engine& rt, const codegen::VerifySpec& spec) {
  return rt.module(spec.fast_key(), [&] { return generate(rt, spec); });
}

// The generated source (and its launch facts), without loading it (no device needed offline).
std::shared_ptr<const codegen::KernelSource> verify_source(Engine& rt, const codegen::VerifySpec& spec) {
  return rt.source(spec.fast_key(), [&] { return generate(rt, spec); });
}

}  // namespace

// The k_cache as a TMA descriptor for kernels that copy whole KV tiles by TMA: a 2-D
// tensor of num_pages * page rows of head_dim_qk 16-bit values, boxes of 64 values
// (one 128-byte swizzled column block) x box_rows rows. Not enabled (the kernel then
// keeps to cp.async) when the driver has no cuTensorMapEncodeTiled or the cache does
// not fit TMA's coordinates (int32 rows).
kdtree_kv_tma encode_kv_tma(const kdtree_verify_args& a, const codegen::VerifySpec& spec, int box_rows) {
  static_assert(sizeof(kdtree_kv_tma::map) == sizeof(CUtensorMap) && alignof(kdtree_kv_tma) >= alignof(CUtensorMap),
                "kdtree_kv_tma::map is a CUtensorMap");
  kdtree_kv_tma t{};
  const driver::Api& api = driver::api();
  const long long rows = (long long)a.num_pages * spec.page_size;
  const int elem = spec.kv_bytes();  // 2: 16-bit caches, 1: e4m3
  if (!api.cuTensorMapEncodeTiled || (elem != 1 && elem != 2) || rows < 1 || rows > INT32_MAX) return t;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(spec.head_dim_qk), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(spec.head_dim_qk) * elem};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / elem), static_cast<cuuint32_t>(box_rows)};  // 128-byte rows
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = api.cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(t.map), elem == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8,
      2, const_cast<void*>(a.k_cache), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  t.enabled = r == CUDA_SUCCESS;
  return t;
}

void check_kv_scales(bool kv_fp8, float k_scale, float v_scale) {
  for (const auto& [name, value] : {std::pair<const char*, float>{"k_scale", k_scale}, {"v_scale", v_scale}}) {
    if (kv_fp8) {
      require(std::isfinite(value) && value > 0.0f,
              "{} {} must be positive and finite for e4m3 caches (value = stored x {})", name, value, name);
    } else {
      // 0 is what a zero-initialised args struct holds; 1 is the identity.
      require(value == 0.0f || value == 1.0f,
              "{} {} is given with 16-bit caches: scales apply to e4m3 caches only (kv_dtype "
              "KDTREE_KV_DTYPE_E4M3); leave it 0 or 1",
              name, value);
    }
  }
}

void check_verify_sizes(const kdtree_verify_spec& s, int max_tree_nodes, int batch_size, int total_nodes,
                        int max_kv_len, int num_splits) {
  require(batch_size >= 1, "batch_size {} must be >= 1", batch_size);
  require(total_nodes >= batch_size && total_nodes <= (long long)batch_size * max_tree_nodes,
          "total_nodes {} is out of range: each of the {} requests has 1..{} (max_tree_nodes) nodes", total_nodes,
          batch_size, max_tree_nodes);
  require(max_kv_len >= 1 && max_kv_len <= KDTREE_MAX_KV_LEN,
          "max_kv_len {} is out of range: 1..{} (KDTREE_MAX_KV_LEN; KV positions are 32-bit on the device)", max_kv_len,
          KDTREE_MAX_KV_LEN);
  require(num_splits >= 0 && num_splits <= kMaxGridYZ,
          "num_splits {} is out of range: 0 (automatic) or 1..{} (the grid's z limit)", num_splits, kMaxGridYZ);
  // One CTA row per (request, KV head): grid y.
  require((long long)batch_size * s.num_kv_heads <= kMaxGridYZ,
          "batch_size {} x num_kv_heads {} = {} exceeds {} (the grid's y limit): split the batch", batch_size,
          s.num_kv_heads, (long long)batch_size * s.num_kv_heads, kMaxGridYZ);
  // Output rows are indexed with int on the host and by the combine grid.
  require((long long)total_nodes * s.num_q_heads <= INT32_MAX,
          "total_nodes {} x num_q_heads {} exceeds 2^31 - 1 output rows: split the batch", total_nodes, s.num_q_heads);
}

// Split partials are stored in out's 16-bit type (each normalised by its own row
// sum, so in out's range): half the bytes of fp32 for the main kernel to write and
// the combine to read. A partial row is head_dim_v such values and an fp32 LSE.
constexpr size_t kPartialElemBytes = 2;
static size_t partial_row_bytes(const kdtree_verify_spec& s) {
  return s.head_dim_v * kPartialElemBytes + sizeof(float);
}

VerifyWorkspace verify_workspace(const kdtree_verify_spec& s, int total_nodes, int num_splits) {
  VerifyWorkspace w;
  if (num_splits <= 1) return w;
  const size_t rows = size_t(num_splits) * size_t(total_nodes) * size_t(s.num_q_heads);
  w.partial_lse = rows * s.head_dim_v * kPartialElemBytes;
  w.bytes = w.partial_lse + rows * sizeof(float);
  return w;
}

VerifyWorkspace verify_stream_workspace(const kdtree_verify_spec& s, int block_m, int stream_ctas) {
  VerifyWorkspace w;
  if (stream_ctas <= 1) return w;  // one CTA cuts nothing: it writes whole items only
  const size_t rows = size_t(KDTREE_STREAM_SLOT_ROWS(stream_ctas, block_m));
  w.partial_lse = rows * s.head_dim_v * kPartialElemBytes;
  w.cut_items = w.partial_lse + rows * sizeof(float);
  w.bytes = w.cut_items + size_t(stream_ctas) * KDTREE_CUT_ITEM_BYTES;
  return w;
}

size_t verify_workspace_bytes(const kdtree_verify_spec& s, int total_nodes, int num_splits) {
  return verify_workspace(s, total_nodes, num_splits).bytes;
}

size_t verify_stream_workspace_bytes(const kdtree_verify_spec& s, int block_m, int stream_ctas) {
  return verify_stream_workspace(s, block_m, stream_ctas).bytes;
}

namespace {

// The combine's CTAs, launched overlapped, are placed as the main kernel's exit, and
// the scheduler fills each SM it frees first to the combine's occupancy: a small
// grid (sm_90, B=1 H=16 n=16: 256 CTAs) then ran on a fifth of the SMs, 5 us slower
// than launched after the main kernel. Requesting max_smem_per_sm / (its even share)
// caps an SM at that share.
void spread_combine(VerifyPlan& plan, const codegen::Arch& arch) {
  if (arch.sm < 90 || plan.combine_grid_x == 0) return;
  const long long per_sm = ceil_div((long long)plan.combine_grid_x * plan.combine_grid_y, arch.num_sms);
  const long long pad = (long long)arch.max_smem_per_sm / per_sm - 1024;  // 1 KB reserved per CTA
  plan.combine_dynamic_smem = static_cast<unsigned>(std::clamp<long long>(pad, 0, arch.max_smem_per_block));
}

// KDTREE_VERIFY_SCHEDULE, a tuning and test override (plan_verify checks its value).
std::string schedule_override() {
  const char* schedule = std::getenv("KDTREE_VERIFY_SCHEDULE");
  return schedule ? schedule : "";
}

}  // namespace

VerifyPlan plan_verify(const codegen::LaunchFacts& launch, const codegen::Arch& arch, const kdtree_verify_spec& s,
                       int batch_size, int total_nodes, int max_kv_len, int forced_splits) {
  if (launch.block_m < 1 || launch.block_n < 1 || launch.threads < 1 || launch.kv_row_bytes < 1) {
    fail(KDTREE_ERROR_INTERNAL, fmt::format("verify_attention launch facts are incomplete (block_m {}, block_n {}, "
                                            "threads {}, kv_row_bytes {})",
                                            launch.block_m, launch.block_n, launch.threads, launch.kv_row_bytes));
  }
  const int group = s.num_q_heads / s.num_kv_heads;
  const long long kv_tiles = ceil_div(max_kv_len, launch.block_n);
  const int ctas_per_sm = codegen::ctas_per_sm(arch, launch.dynamic_smem, launch.threads);
  long long splits = forced_splits;
  long long stream_ctas = 0;
  const std::string forced_schedule = schedule_override();
  if (!forced_schedule.empty() && forced_schedule != "stream" && forced_schedule != "splits" &&
      forced_schedule != "cluster") {
    fail(KDTREE_ERROR_INVALID_ARGUMENT,
         fmt::format("KDTREE_VERIFY_SCHEDULE='{}' must be stream, splits, cluster or empty", forced_schedule));
  }
  // KDTREE_VERIFY_SCHEDULE=cluster: uniform splits (at most KDTREE_MAX_CLUSTER_SPLITS) whose
  // CTAs run as one thread-block cluster per row tile and merge in shared memory: no
  // partials, no workspace, no combine. A forced num_splits is taken as it is (1: one
  // CTA a row tile, nothing to merge).
  const bool cluster = forced_schedule == "cluster";
  const bool can_cluster = launch.cluster_merge && arch.sm >= 90;  // the entry, and clusters on the arch
  if (cluster) {
    if (!can_cluster) {
      fail(KDTREE_ERROR_INVALID_ARGUMENT,
           fmt::format(
               "KDTREE_VERIFY_SCHEDULE=cluster needs a kernel that merges splits in a thread-block cluster "
               "(sm_120's qsplit e4m3 kernel, sm_90's MLA wgmma kernels) on sm_90 or newer; this call runs {} on {}",
               launch.kernel, arch.name()));
    }
    require(forced_splits <= KDTREE_MAX_CLUSTER_SPLITS,
            "num_splits {} with KDTREE_VERIFY_SCHEDULE=cluster must be 0 (automatic), 1 or 2..{} (a cluster's CTAs)",
            forced_splits, KDTREE_MAX_CLUSTER_SPLITS);
  }
  // Two splits of a kernel measured (sm_90) or predicted (sm_120) faster merged in a
  // cluster run as one unless the schedule is forced (KDTREE_VERIFY_SCHEDULE=splits
  // keeps the partials and the combine).
  const bool two_in_cluster = can_cluster && launch.cluster_two_splits && forced_schedule.empty();
  if (splits == 0) {
    // Model the time in KV tiles. Uniform splits: waves x KV tiles per CTA; a CTA
    // streams ceil(kv_tiles / s) tiles plus about one tile's worth of fixed work (Q
    // load, pipeline fill, and the combine when s > 1); CTAs run ctas_per_sm at a
    // time on every SM. Bytes count in tile times too: bytes x the arch's FLOP per
    // DRAM byte x the kernel's tensor_rate / (SMs x a tile's FLOPs). No plan streams
    // the KV faster than DRAM (the floor: every request's KV read once, as if each
    // were max_kv_len long), and with s > 1 the partials (s x rows x
    // partial_row_bytes) go through memory after it. The cheapest s wins (the fewest
    // on a tie), so small batches spread the KV over the whole GPU, large ones are
    // not cut into a partial last wave, and bytes-bound batches do not trade KV reads
    // for partials. Cluster plans (forced, or two splits of a cluster_two_splits
    // kernel): without the partials' bytes or the combine.
    const long long ctas =
        std::max<long long>(ceil_div((long long)total_nodes * group, launch.block_m), batch_size) * s.num_kv_heads;
    const long long slots = (long long)arch.num_sms * ctas_per_sm;
    const double tile_flops = 2.0 * launch.block_m * launch.block_n * (s.head_dim_qk + s.head_dim_v);
    const double tiles_per_byte = launch.tensor_rate * arch.flop_per_dram_byte / (arch.num_sms * tile_flops);
    const double kv_floor =
        double(batch_size) * s.num_kv_heads * kv_tiles * launch.block_n * launch.kv_row_bytes * tiles_per_byte;
    const double row_partial_bytes = double(total_nodes) * s.num_q_heads * partial_row_bytes(s);
    const long long first = cluster ? 2 : 1;
    double best = 0;
    for (long long cand = first; cand <= std::min<long long>(cluster ? KDTREE_MAX_CLUSTER_SPLITS : 64, kv_tiles);
         ++cand) {
      const bool partials = cand > 1 && !cluster && !(two_in_cluster && cand == 2);
      double waves = std::ceil(double(ctas * cand) / slots);
      double cost = std::max(waves * (ceil_div(kv_tiles, cand) + (partials ? 1.5 : 1.0)), kv_floor) +
                    (partials ? cand * row_partial_bytes * tiles_per_byte : 0.0);
      if (cand == first || cost < best) {
        best = cost;
        splits = cand;
      }
    }
    // No empty trailing split (one KV tile leaves a cluster plan no candidate: one split).
    splits = splits > 0 ? ceil_div(kv_tiles, ceil_div(kv_tiles, splits)) : 1;
    if (launch.stream_k && !cluster && forced_schedule != "splits") {
      // Stream-K: one CTA per slot share the ctas x kv_tiles units evenly, so no
      // wave is partial; a CTA pays the fixed work once per item it touches (the
      // kernel's stream_segment_tiles), and
      // each cut item writes a partial per piece (two slots of block_m rows per CTA).
      const long long units = ctas * kv_tiles;
      const long long p_ctas = std::min(slots, units);
      const long long chunk = ceil_div(units, p_ctas);
      const long long segments = 1 + ceil_div(chunk - 1, kv_tiles);
      const double slot_bytes = 2.0 * p_ctas * launch.block_m * partial_row_bytes(s);
      const double cost = std::max(chunk + launch.stream_segment_tiles * segments, kv_floor) +
                          (p_ctas > 1 ? slot_bytes * tiles_per_byte : 0.0);
      if (cost < best || forced_schedule == "stream") stream_ctas = p_ctas;
    }
  }
  if (stream_ctas > 0) {
    VerifyPlan plan;
    plan.stream_ctas = static_cast<int>(stream_ctas);
    plan.split_tokens = checked_int(kv_tiles * launch.block_n, "split_tokens");
    plan.workspace_bytes = verify_stream_workspace_bytes(s, launch.block_m, plan.stream_ctas);
    plan.grid_x = static_cast<unsigned>(plan.stream_ctas);
    plan.grid_y = 1;
    if (plan.stream_ctas > 1) {
      // A group of CTAs per boundary between stream-K CTAs, merging the rows of the item it cuts.
      plan.combine_grid_x = static_cast<unsigned>((stream_ctas - 1) * ceil_div(launch.block_m, launch.combine_rows));
    }
    spread_combine(plan, arch);
    return plan;
  }
  VerifyPlan plan;
  plan.num_splits = static_cast<int>(splits);
  plan.split_tokens = checked_int(ceil_div(kv_tiles, splits) * launch.block_n, "split_tokens");
  plan.grid_x = static_cast<unsigned>(ceil_div((long long)s.max_tree_nodes * group, launch.block_m));
  plan.grid_y = static_cast<unsigned>(batch_size * s.num_kv_heads);
  plan.grid_z = static_cast<unsigned>(plan.num_splits);
  if (cluster || (two_in_cluster && splits == 2)) {
    plan.cluster_splits = plan.num_splits > 1 ? plan.num_splits : 0;
    return plan;
  }
  plan.workspace_bytes = verify_workspace_bytes(s, total_nodes, plan.num_splits);
  if (plan.num_splits > 1) {
    // Row blocks enough for a request of average size; a larger request's CTAs loop.
    const long long mean_rows = ceil_div((long long)total_nodes * s.num_q_heads, batch_size);
    plan.combine_grid_x = static_cast<unsigned>(ceil_div(mean_rows, launch.combine_rows));
    plan.combine_grid_y = static_cast<unsigned>(batch_size);
  }
  spread_combine(plan, arch);
  return plan;
}

void verify_attention(Engine& rt, const kdtree_verify_args& a) {
  const codegen::VerifySpec spec = codegen::validate_verify_spec(a.spec);
  check_verify_sizes(a.spec, spec.max_tree_nodes, a.batch_size, a.total_nodes, a.max_kv_len, a.num_splits);
  // 16-byte cp.async rows for q and the caches; 4-byte stores of out.
  require_buffer(a.q, 16, "q");
  require_buffer(a.node_indptr, 4, "node_indptr");
  require_buffer(a.k_cache, 16, "k_cache");
  require_buffer(a.page_table, 4, "page_table");
  require_buffer(a.kv_lens, 4, "kv_lens");
  require_buffer(a.tree_mask, 8, "tree_mask");
  // e4m3 caches and sm_90's MLA kernels store out 8 bytes at a time.
  require_buffer(a.out, 8, "out");
  require_optional_buffer(a.lse, 4, "lse");
  require_optional_buffer(a.error_flags, 4, "error_flags");
  // The combine kernel reads the split partials as float4.
  require_optional_buffer(a.workspace, 16, "workspace");
  if (spec.mla()) {
    require(a.v_cache == nullptr, "v_cache must be NULL for MLA (V is the first head_dim_v dims of the k_cache row)");
  } else {
    require_buffer(a.v_cache, 16, "v_cache");
  }
  require(a.num_pages >= 1, "num_pages {} must be >= 1", a.num_pages);
  require(a.max_pages_per_req >= 1, "max_pages_per_req {} must be >= 1", a.max_pages_per_req);
  // Positive: the kernel takes row maxima of the raw scores and scales them once.
  require(std::isfinite(a.sm_scale) && a.sm_scale > 0.0f,
          "sm_scale {} must be positive and finite (e.g. 1/sqrt(head_dim_qk))", a.sm_scale);
  check_kv_scales(spec.kv_fp8(), a.k_scale, a.v_scale);
  const size_t out_bytes = size_t(a.total_nodes) * a.spec.num_q_heads * a.spec.head_dim_v * 2;
  const size_t lse_bytes = size_t(a.total_nodes) * a.spec.num_q_heads * 4;
  require_disjoint({{a.out, out_bytes, "out"}, {a.lse, lse_bytes, "lse"}, {a.error_flags, 4, "error_flags"}});
  auto check_workspace = [&](size_t needed) {
    require(needed == 0 || (a.workspace != nullptr && a.workspace_size >= needed),
            "workspace too small: {} bytes given, {} needed (kdtree_verify_workspace_size)",
            a.workspace ? a.workspace_size : 0, needed);
  };
  // A forced split count fixes the workspace without asking the device: its partials, or none
  // when the splits merge in a thread-block cluster (checked with the plan below).
  if (a.num_splits > 0 && schedule_override() != "cluster") {
    check_workspace(verify_workspace_bytes(a.spec, a.total_nodes, a.num_splits));
  }

  Module& module = verify_module(rt, spec);
  const codegen::LaunchFacts& launch = module.launch();
  const VerifyPlan plan =
      plan_verify(launch, rt.arch(), a.spec, a.batch_size, a.total_nodes, a.max_kv_len, a.num_splits);
  check_workspace(plan.workspace_bytes);
  require_disjoint({{a.out, out_bytes, "out"},
                    {a.lse, lse_bytes, "lse"},
                    {plan.workspace_bytes ? a.workspace : nullptr, plan.workspace_bytes, "workspace"},
                    {a.error_flags, 4, "error_flags"}});

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
  p.stream_ctas = plan.stream_ctas;
  p.cluster_splits = plan.cluster_splits;
  // e4m3: scores are q . code x k_scale, so k_scale folds into the score scale;
  // O = P . code x v_scale, applied by the kernel once at the end.
  p.scale_log2 = a.sm_scale * (spec.kv_fp8() ? a.k_scale : 1.0f) * 1.4426950408889634f;
  p.v_scale = spec.kv_fp8() ? a.v_scale : 1.0f;
  const VerifyWorkspace ws = plan.stream_ctas > 0 ? verify_stream_workspace(a.spec, launch.block_m, plan.stream_ctas)
                                                  : verify_workspace(a.spec, a.total_nodes, plan.num_splits);
  if (ws.bytes > 0) {
    char* base = static_cast<char*>(a.workspace);
    p.partial_o = base;
    p.partial_lse = reinterpret_cast<float*>(base + ws.partial_lse);
    p.cut_items = ws.cut_items ? base + ws.cut_items : nullptr;
  }
  void* args[] = {&p};
  // Kernels that copy by TMA take the cache's descriptor as a second parameter.
  kdtree_kv_tma kv_tma{};
  if (launch.kv_tma_box_rows > 0) kv_tma = encode_kv_tma(a, spec, launch.kv_tma_box_rows);
  void* main_args[] = {&p, &kv_tma};
  CUstream stream = static_cast<CUstream>(a.stream);

  LaunchDims main;
  main.grid_x = plan.grid_x;
  main.grid_y = plan.grid_y;
  main.grid_z = plan.grid_z;
  main.block_x = static_cast<unsigned>(launch.threads);
  main.dynamic_smem = static_cast<unsigned>(launch.dynamic_smem);
  main.cluster_z = plan.cluster_splits > 1 ? static_cast<unsigned>(plan.cluster_splits) : 1u;
  const char* main_entry = plan.cluster_splits > 1 ? "kdtree_verify_attention_cluster" : "kdtree_verify_attention";
  rt.launch(module.function(main_entry, launch.dynamic_smem), main, launch.kv_tma_box_rows > 0 ? main_args : args,
            stream, "launching kdtree_verify_attention");
  if (plan.combine_grid_x > 0) {
    LaunchDims combine;
    combine.grid_x = plan.combine_grid_x;
    combine.grid_y = plan.combine_grid_y;
    combine.block_x = static_cast<unsigned>(launch.combine_threads);
    combine.overlap_previous = true;  // its CTAs start while the main kernel's last ones run
    if (rt.programmatic_launch()) combine.dynamic_smem = plan.combine_dynamic_smem;
    const char* entry = plan.stream_ctas > 0 ? "kdtree_verify_combine_stream" : "kdtree_verify_combine";
    rt.launch(module.function(entry, static_cast<int>(combine.dynamic_smem)), combine, args, stream,
              "launching the split combine");
  }
}

size_t verify_workspace_size(Engine& rt, const kdtree_verify_spec& s, int batch_size, int total_nodes, int max_kv_len) {
  const codegen::VerifySpec spec = codegen::validate_verify_spec(s);
  check_verify_sizes(s, spec.max_tree_nodes, batch_size, total_nodes, max_kv_len, 0);
  return plan_verify(verify_source(rt, spec)->launch, rt.arch(), s, batch_size, total_nodes, max_kv_len, 0)
      .workspace_bytes;
}

void warm_verify(Engine& rt, const kdtree_verify_spec& s) {
  const codegen::VerifySpec spec = codegen::validate_verify_spec(s);
  if (rt.has_device()) {
    verify_module(rt, spec);
  } else {
    rt.compile(*verify_source(rt, spec));
  }
}

}  // namespace kdtree
