// kdtree_kv_compact: host validation (before any device use) and the launch:
// grid (column chunks of the K and V rows, requests, layers). Paths, node counts
// and page ids live on the device and are checked there (error_flags).
#include <cstdint>

#include <fmt/format.h>

#include "codegen/dtype_check.hpp"
#include "codegen/kv_compact.hpp"
#include "kv_compact_params.h"
#include "runtime/arg_checks.hpp"
#include "runtime/tree_ops.hpp"

namespace kdtree {
namespace {

// A row (one token's cached elements of all its KV heads) of at most 1 GiB: its 16-byte
// vectors and the grid's column chunks then stay far inside int.
constexpr long long kMaxRowBytes = 1ll << 30;

// Rows are copied as 16-byte vectors: 8 16-bit or 16 e4m3 elements.
void require_row(int elems, int elem_bytes, const char* name, const char* type) {
  const int per_vec = 16 / elem_bytes;
  require(elems % per_vec == 0, "{} = {} must be a multiple of {} for {} rows (rows are copied as 16-byte vectors)",
          name, elems, per_vec, type);
  require((long long)elems * elem_bytes <= kMaxRowBytes, "{} = {} is {} bytes a row: at most {} (1 GiB)", name, elems,
          (long long)elems * elem_bytes, kMaxRowBytes);
}

constexpr int kMaxGridYZ = 65535;

}  // namespace

void kv_compact(Engine& rt, const kdtree_kv_compact_args& a) {
  codegen::KvCompactSpec spec;
  spec.page_size = a.page_size;
  spec.max_tree_nodes = a.max_tree_nodes;
  codegen::validate(spec);
  const kdtree_dtype dtype = codegen::checked_dtype(a.dtype, "dtype");
  if (dtype != KDTREE_DTYPE_BF16 && dtype != KDTREE_DTYPE_F16) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("kv_compact: cache dtype {} is not supported: use BF16 or F16", static_cast<int>(dtype)));
  }
  const bool fp8 = codegen::checked_kv_dtype(a.kv_dtype, "kv_dtype") == KDTREE_KV_DTYPE_E4M3;
  const int elem_bytes = fp8 ? 1 : 2;
  const char* type = fp8 ? "e4m3" : "16-bit";
  require(a.num_layers >= 1 && a.num_layers <= kMaxGridYZ, "num_layers = {} must be in [1, {}]", a.num_layers,
          kMaxGridYZ);
  require(a.batch_size >= 1 && a.batch_size <= kMaxGridYZ, "batch_size = {} must be in [1, {}]", a.batch_size,
          kMaxGridYZ);
  require(a.num_pages >= 1, "num_pages = {} must be >= 1", a.num_pages);
  require(a.max_pages_per_req >= 1, "max_pages_per_req = {} must be >= 1", a.max_pages_per_req);
  require(a.row_elems_k >= 1, "row_elems_k = {} must be >= 1", a.row_elems_k);
  require_row(a.row_elems_k, elem_bytes, "row_elems_k", type);
  require(a.row_elems_v >= 0, "row_elems_v = {} must be >= 0 (0 for MLA)", a.row_elems_v);
  require_row(a.row_elems_v, elem_bytes, "row_elems_v", type);
  require_buffer(a.k_caches, 8, "k_caches");
  if (a.row_elems_v == 0) {
    require(a.v_caches == nullptr, "v_caches must be NULL when row_elems_v is 0 (MLA: one cache)");
  } else {
    require(a.v_caches != nullptr, "v_caches is NULL but row_elems_v = {} (NULL only for MLA, with row_elems_v = 0)",
            a.row_elems_v);
    require_buffer(a.v_caches, 8, "v_caches");
  }
  require_buffer(a.page_table, 4, "page_table");
  require_buffer(a.kv_lens, 4, "kv_lens");
  require_buffer(a.node_counts, 4, "node_counts");
  require_buffer(a.accepted_path, 4, "accepted_path");
  require_buffer(a.accept_lens, 4, "accept_lens");
  require_optional_buffer(a.error_flags, 4, "error_flags");

  const int chunk = codegen::kKvCompactChunkVecs;
  // The kernel moves bytes: the row widths in 16-byte vectors are all it needs.
  const int row_vecs_k = static_cast<int>((long long)a.row_elems_k * elem_bytes / 16);
  const int row_vecs_v = static_cast<int>((long long)a.row_elems_v * elem_bytes / 16);
  const int chunks_k = (row_vecs_k + chunk - 1) / chunk, chunks_v = (row_vecs_v + chunk - 1) / chunk;

  Module& module = rt.module(spec.fast_key(), [&] { return codegen::generate_kv_compact(spec, rt.arch()); });
  CUfunction fn = module.function("kdtree_kv_compact", 0);

  kdtree_kv_compact_params p{};
  p.k_caches = reinterpret_cast<const unsigned long long*>(a.k_caches);
  p.v_caches = reinterpret_cast<const unsigned long long*>(a.v_caches);
  p.page_table = a.page_table;
  p.kv_lens = a.kv_lens;
  p.node_counts = a.node_counts;
  p.accepted_path = a.accepted_path;
  p.accept_lens = a.accept_lens;
  p.error_flags = a.error_flags;
  p.num_pages = a.num_pages;
  p.max_pages_per_req = a.max_pages_per_req;
  p.row_vecs_k = row_vecs_k;
  p.row_vecs_v = row_vecs_v;
  p.chunks_k = chunks_k;
  void* args[] = {&p};

  LaunchDims dims;
  dims.grid_x = static_cast<unsigned>(chunks_k + chunks_v);
  dims.grid_y = static_cast<unsigned>(a.batch_size);
  dims.grid_z = static_cast<unsigned>(a.num_layers);
  dims.block_x = static_cast<unsigned>(module.launch().threads);
  rt.launch(fn, dims, args, static_cast<CUstream>(a.stream), "kv_compact");
}

}  // namespace kdtree
