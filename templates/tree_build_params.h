/* Parameters of the generated tree_build kernel (DDTree best-first selection).
 * Plain C with builtin types only, shared by host code and the kernel source;
 * NVRTC sees no system headers. Layouts are those of kdtree_tree_build_args. */
#ifndef KDTREE_TREE_BUILD_PARAMS_H
#define KDTREE_TREE_BUILD_PARAMS_H

typedef struct kdtree_tree_build_params {
  const int* draft_tokens;       /* [B, D, K] */
  const float* draft_logprobs;   /* [B, D, K], descending along K */
  const int* root_tokens;        /* [B] */
  const int* prefix_lens;        /* [B] */
  int* tokens;                   /* [B, W] */
  int* parents;                  /* [B, W] */
  int* depths;                   /* [B, W] */
  int* positions;                /* [B, W] */
  unsigned long long* tree_mask; /* [B, W, ceil(W / 64)] */
  int* first_child;              /* [B, W] */
  int* next_sibling;             /* [B, W] */
  int* node_counts;              /* [B] */
  float* scores;                 /* [B, W] or 0 */
  int batch_size;
  int depth;  /* D, 1..16 (host-validated) */
  int top_k;  /* K, 1..64 */
  int budget; /* 1..W-1 */
} kdtree_tree_build_params;

#endif /* KDTREE_TREE_BUILD_PARAMS_H */
