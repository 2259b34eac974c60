// Compile-time configuration of templates/verify_attention_qsplit.cu. The generator defines
// every KD_* value in the prelude it puts before the kernel source (codegen/verify_attention.cpp),
// and must define exactly these. The defaults (MLA 576/512, W=64, page 64, bf16, sm_120's
// tiles kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32) only let editors and `nvcc -fdevice-syntax-only -I templates -I include`
// read the template alone.

#ifndef KD_HEAD_DIM_QK
#define KD_HEAD_DIM_QK 576  // Q/K head dim
#endif
#ifndef KD_HEAD_DIM_V
#define KD_HEAD_DIM_V 512  // V head dim
#endif
#ifndef KD_PAGE_SIZE
#define KD_PAGE_SIZE 64  // tokens per KV page
#endif
#ifndef KD_MAX_TREE_NODES
#define KD_MAX_TREE_NODES 64  // W
#endif
#ifndef KD_IS_MLA
#define KD_IS_MLA true  // V = the first HEAD_DIM_V dims of the K row
#endif
#ifndef KD_IS_BF16
#define KD_IS_BF16 true  // else f16
#endif
#ifndef KD_KV_FP8
#define KD_KV_FP8 false  // e4m3 KV caches (kv_fp8.cuh), else q's 16-bit type
#endif
#ifndef KD_MMA_E4M3
#define KD_MMA_E4M3 false  // e4m3 caches: QK and PV on e4m3 MMAs, Q and P quantised (kv_fp8.cuh)
#endif
#ifndef KD_KV_ROWS_PACKED
#define KD_KV_ROWS_PACKED false  // e4m3 MLA rows of 36 chunks unpadded (the qsplit kernel's e4m3 MMA path)
#endif
#ifndef KD_MMA_BLOCK_SCALED
#define KD_MMA_BLOCK_SCALED false  // the e4m3 MMA in its block-scaled sm_120a form
#endif
#ifndef KD_BLOCK_M
#define KD_BLOCK_M 64  // rows (node x head) per CTA
#endif
#ifndef KD_BLOCK_N
#define KD_BLOCK_N 16  // KV tokens per tile
#endif
#ifndef KD_WARPS_M
#define KD_WARPS_M 2  // warp rows
#endif
#ifndef KD_WARPS_N
#define KD_WARPS_N 4  // column warps per warp row: each holds Q's rows over HEAD_DIM / WARPS_N dims
#endif
#ifndef KD_WARP_ROWS
#define KD_WARP_ROWS 32  // rows per warp
#endif
#ifndef KD_STAGES
#define KD_STAGES 4  // cp.async pipeline depth (copies STAGES - 2 tiles ahead)
#endif
#ifndef KD_SMEM_PART_S
#define KD_SMEM_PART_S 73728  // byte offset of the partial S tiles (K stages at 0; Q is staged at 0 first)
#endif
#ifndef KD_SMEM_P
#define KD_SMEM_P 90112  // of P
#endif
#ifndef KD_SMEM_Q_SCALE
#define KD_SMEM_Q_SCALE 73728  // of Q's row scales while Q is staged (the e4m3 MMA path; past Q's e4m3 rows)
#endif
#ifndef KD_SMEM_STATS
#define KD_SMEM_STATS 92160  // of the per-row rescale factors, row sums and maxima
#endif
#ifndef KD_SMEM_WALK
#define KD_SMEM_WALK 92928  // of the CTA's segment walk (KDTREE_SEGMENT_WALK_BYTES)
#endif
#ifndef KD_CLUSTER_MERGE
#define KD_CLUSTER_MERGE 0  // 1: a kdtree_verify_attention_cluster entry (the e4m3 MMA path, its rows fitting the K stages)
#endif
#ifndef KD_COMBINE_THREADS
#define KD_COMBINE_THREADS 128  // threads per combine CTA
#endif
#ifndef KD_COMBINE_ROW_THREADS
#define KD_COMBINE_ROW_THREADS 128  // combine threads per row
#endif
