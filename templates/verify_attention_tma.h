/* The TMA descriptor of the KV cache, the second launch parameter of verify_attention
 * kernels whose launch facts ask for one (LaunchFacts::kv_tma_box_rows > 0: the wgmma
 * family). Plain C, shared by the host (runtime/verify_attention.cpp) and the device
 * code; passed by value (__grid_constant__, so the kernel can hand TMA its address). */
#ifndef KDTREE_VERIFY_ATTENTION_TMA_H
#define KDTREE_VERIFY_ATTENTION_TMA_H

typedef struct __attribute__((aligned(128))) kdtree_kv_tma {
  /* A CUtensorMap (cuda.h): k_cache as [num_pages * page rows, head_dim] 16-bit or e4m3 values, boxes of one
   * 128-byte swizzled column block (64 or 128 values) x kv_tma_box_rows rows. */
  unsigned long long map[16];
  int enabled; /* 0: the host could not encode it (the kernel copies by cp.async) */
} kdtree_kv_tma;

#endif
