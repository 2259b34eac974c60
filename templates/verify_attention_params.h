/* Launch parameters of the generated verify_attention kernels. Plain C, shared by
 * the host (runtime/verify_attention.cpp) and the device code, so the layout is
 * one definition. Passed by value as the kernels' only argument. */
#ifndef KDTREE_VERIFY_ATTENTION_PARAMS_H
#define KDTREE_VERIFY_ATTENTION_PARAMS_H

typedef struct kdtree_verify_params {
  const void* q;                       /* [total_nodes, num_q_heads, D] */
  const void* k_cache;                 /* [num_pages, page, num_kv_heads, D] */
  const void* v_cache;                 /* [num_pages, page, num_kv_heads, DV]; MLA: == k_cache */
  const int* node_indptr;              /* [batch + 1] */
  const int* page_table;               /* [batch, max_pages_per_req] */
  const int* kv_lens;                  /* [batch] */
  const unsigned long long* tree_mask; /* [total_nodes, MASK_WORDS] */
  void* out;                           /* [total_nodes, num_q_heads, DV] */
  float* lse;                          /* [total_nodes, num_q_heads] or 0 */
  void* partial_o;                     /* out's 16-bit type, each row normalised by its own sum:
                                          [num_splits, total_nodes * num_q_heads, DV] when num_splits > 1;
                                          stream-K: [2 * stream_ctas, BLOCK_M, DV] (a CTA's first and last segment) */
  float* partial_lse;                  /* the same rows' LSE (log2 domain) */
  void* cut_items;                     /* stream-K: [stream_ctas] 64-byte records, the item each CTA boundary cuts */
  int* error_flags;                    /* or 0 */
  int batch_size;
  int total_nodes;
  int num_q_heads;
  int num_kv_heads;
  int group; /* num_q_heads / num_kv_heads */
  int max_pages_per_req;
  int num_pages;
  int max_kv_len;
  int num_splits;
  int stream_ctas; /* > 0: stream-K, a 1-D grid of this many CTAs splitting all KV tiles evenly (num_splits 1) */
  int split_tokens; /* KV tokens per split, a multiple of BLOCK_N */
  float scale_log2; /* sm_scale * log2(e); e4m3 caches: times k_scale */
  float v_scale;    /* e4m3 caches: the V dequantisation scale, applied to O once at the end (1 otherwise) */
  int cluster_splits; /* > 1: the num_splits splits of a row tile run as one thread-block cluster (z) and
                         merge in shared memory (no partials, no combine); 0 otherwise */
} kdtree_verify_params;

#endif
