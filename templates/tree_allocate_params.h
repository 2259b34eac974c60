/* Parameters of the generated tree_allocate kernel. Plain C with builtin types
 * only, shared by host code and the kernel source. Layouts are those of
 * kdtree_tree_allocate_args. */
#ifndef KDTREE_TREE_ALLOCATE_PARAMS_H
#define KDTREE_TREE_ALLOCATE_PARAMS_H

typedef struct kdtree_tree_allocate_params {
  const float* scores;         /* [B, W] */
  const unsigned char* active; /* [B] or 0 (every request decoding) */
  const int* remaining;        /* [B] or 0 (no weighting) */
  int* node_counts;            /* [B] */
  int* node_indptr;            /* [B + 1] */
  long long* row_req;          /* [B + total] */
  long long* row_node;         /* [B + total] */
  int* error_flags;            /* one word or 0 */
  float urgency;
  int batch_size;
  int cap;
  int total;
} kdtree_tree_allocate_params;

#endif /* KDTREE_TREE_ALLOCATE_PARAMS_H */
