/* Parameters of the generated tree_accept kernel. Plain C with builtin types
 * only, shared by host code and the kernel source. Layouts are those of
 * kdtree_tree_accept_args. */
#ifndef KDTREE_TREE_ACCEPT_PARAMS_H
#define KDTREE_TREE_ACCEPT_PARAMS_H

typedef struct kdtree_tree_accept_params {
  const int* tokens;        /* [B, W] */
  const int* parents;       /* [B, W] */
  const int* node_counts;   /* [B] */
  const int* target_tokens; /* [B, W] padded, or packed [total_nodes] with node_indptr */
  const int* node_indptr;   /* [B + 1] or 0 */
  int* accepted_path;       /* [B, W] */
  int* accept_lens;         /* [B] */
  int* bonus_tokens;        /* [B] */
  int* error_flags;         /* one word or 0 */
  int batch_size;
  int total_nodes; /* length of packed target_tokens; unused when node_indptr is 0 */
} kdtree_tree_accept_params;

#endif /* KDTREE_TREE_ACCEPT_PARAMS_H */
