/* Launch parameters of the generated kv_compact kernel. Plain C, shared by the
 * host (runtime/kv_compact.cpp) and the device code, so the layout has one
 * definition. Passed by value as the kernel's only argument. The grid is
 * (chunks_k + chunks_v column chunks, batch, layers). */
#ifndef KDTREE_KV_COMPACT_PARAMS_H
#define KDTREE_KV_COMPACT_PARAMS_H

typedef struct kdtree_kv_compact_params {
  const unsigned long long* k_caches; /* [num_layers] pointers to [num_pages, page_size, row_vecs_k * 8] */
  const unsigned long long* v_caches; /* [num_layers] or 0 (MLA) */
  const int* page_table;              /* [batch, max_pages_per_req] */
  const int* kv_lens;                 /* [batch]: prefix + n_b, before compaction */
  const int* node_counts;             /* [batch]: n_b */
  const int* accepted_path;           /* [batch, MAX_TREE_NODES], root first */
  const int* accept_lens;             /* [batch]: path length - 1 */
  int* error_flags;                   /* or 0 */
  int num_pages;
  int max_pages_per_req;
  int row_vecs_k; /* 16-byte vectors per K row */
  int row_vecs_v; /* 16-byte vectors per V row; 0 for MLA */
  int chunks_k;   /* column chunks of a K row; chunks past it are V's */
} kdtree_kv_compact_params;

#endif
