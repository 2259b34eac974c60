/* Layouts that the host (codegen/verify_attention.cpp, runtime/verify_attention.cpp)
 * and the verify_attention kernels share, defined once. Plain C without includes:
 * NVRTC compiles it into the kernels and the runtime includes it as is. */
#ifndef KDTREE_VERIFY_ATTENTION_LAYOUT_H
#define KDTREE_VERIFY_ATTENTION_LAYOUT_H

/* ---- The qsplit kernel's shared-memory tail (after P): KDTREE_QSPLIT_STATS floats
 * per row (the tile's O rescale factor, then at the end the row sum and the
 * reference max), then the CTA's segment walk, which thread 0 keeps there. */
#define KDTREE_QSPLIT_STATS 3
#define KDTREE_SEGMENT_WALK_BYTES 128

/* ---- Splits merged in a thread-block cluster (kdtree_verify_params.cluster_splits): at most
 * the portable cluster size, which the host plans and the merge unrolls. */
#define KDTREE_MAX_CLUSTER_SPLITS 8

/* ---- Stream-K: what the combine needs of the item a CTA boundary c cuts (the item
 * holding unit c * chunk when that is not the item's first unit), written by CTA c
 * for the first boundary inside the item (merge 0 otherwise). */
typedef struct kdtree_cut_item {
  long long u0;    /* the item's first unit */
  long long chunk; /* units per CTA */
  int c0, pieces;  /* the first CTA holding a piece, and how many do */
  int node_base, rows_total, out_head0, m_tile;
  int merge;
} kdtree_cut_item;
#define KDTREE_CUT_ITEM_BYTES 64 /* per stream-K CTA in the workspace */
#ifdef __cplusplus
static_assert(sizeof(kdtree_cut_item) <= KDTREE_CUT_ITEM_BYTES, "a cut item's workspace record");
#endif

/* ---- The workspace of kdtree_verify_attention (kdtree_verify_workspace_size), fp32:
 * uniform splits (num_splits > 1): partial O [num_splits][rows][head_dim_v], then
 *   partial LSE [num_splits][rows] (log2 domain), rows = total_nodes * num_q_heads;
 * stream-K (stream_ctas > 1): partial O [KDTREE_STREAM_SLOT_ROWS][head_dim_v], then
 *   partial LSE [KDTREE_STREAM_SLOT_ROWS], then [stream_ctas] cut items of
 *   KDTREE_CUT_ITEM_BYTES (8-byte aligned: the slot rows are even). Slot 2c holds
 *   CTA c's first segment's piece of a cut item, slot 2c + 1 its last one's. */
#define KDTREE_STREAM_SLOT_ROWS(stream_ctas, block_m) (2 * (stream_ctas) * (block_m))

#endif /* KDTREE_VERIFY_ATTENTION_LAYOUT_H */
