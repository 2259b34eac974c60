/*
 * kdtree: the bits kernels set in the optional device word `error_flags` when
 * device-side input is malformed. The affected outputs are written as NaN
 * (attention), -1 (token ids) or a root-only allocation (tree_allocate), never
 * left stale.
 *
 * Part of kdtree.h (which includes it); a header of its own, plain C without
 * includes, because the kernel templates include it as well (NVRTC has no C
 * library headers).
 */
#ifndef KDTREE_DEVICE_ERRORS_H
#define KDTREE_DEVICE_ERRORS_H

enum {
  KDTREE_DEVICE_ERROR_NODE_COUNT = 1, /* n_b < 1, n_b > max_tree_nodes, kv_len < n_b, or a node_indptr
                                         segment that disagrees with n_b or leaves [0, total_nodes) */
  KDTREE_DEVICE_ERROR_KV_LEN = 2,     /* kv_len > max_kv_len or beyond max_pages_per_req pages */
  KDTREE_DEVICE_ERROR_PAGE_INDEX = 4, /* page table entry outside [0, num_pages) */
  KDTREE_DEVICE_ERROR_TREE = 8,       /* parents not topological / root not -1 */
  KDTREE_DEVICE_ERROR_PATH = 16,      /* accepted path malformed (kv_compact) */
  KDTREE_DEVICE_ERROR_SCORES = 32     /* tree_allocate: a score NaN, or higher than the node before it */
};

#endif /* KDTREE_DEVICE_ERRORS_H */
