// Compile-time configuration of templates/verify_attention_wgmma_e4m3.cu. The generator defines
// every KD_* value in the prelude it puts before the kernel source (codegen/verify_attention.cpp),
// and must define exactly these. The defaults (MLA 576/512, W=64, page 64, bf16 q over an e4m3
// cache, sm_90a's tiles kernel=wgmma,block_m=64,block_n=64,warps=8,stages=4,warp_rows=16,mma=e4m3) only let editors and
// `nvcc -arch=sm_90a -fdevice-syntax-only -I templates -I include` read the template alone.

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
#define KD_KV_FP8 true  // e4m3 KV caches (kv_fp8.cuh), else q's 16-bit type
#endif
#ifndef KD_MMA_E4M3
#define KD_MMA_E4M3 true  // e4m3 caches: QK and PV on e4m3 MMAs, Q and P quantised (kv_fp8.cuh)
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
#define KD_BLOCK_N 64  // KV tokens per tile
#endif
#ifndef KD_WARPS_M
#define KD_WARPS_M 4  // warps of a warpgroup, 16 rows each
#endif
#ifndef KD_WARPS_N
#define KD_WARPS_N 2  // warpgroups: each the QK of one slot's tile, the PV of half the V columns
#endif
#ifndef KD_WARP_ROWS
#define KD_WARP_ROWS 16  // rows per warp (wgmma's m64 over 4 warps)
#endif
#ifndef KD_STAGES
#define KD_STAGES 4  // KV slots (two pairs of tiles in flight)
#endif
#ifndef KD_SMEM_K
#define KD_SMEM_K 32768  // byte offset of the four K slots (Q's latent codes at 0)
#endif
#ifndef KD_SMEM_P
#define KD_SMEM_P 196608  // of slot 0's P
#endif
#ifndef KD_SMEM_P1
#define KD_SMEM_P1 204800  // of slot 1's P
#endif
#ifndef KD_SMEM_RED
#define KD_SMEM_RED 212992  // of the row exchange ([2][BLOCK_M] floats)
#endif
#ifndef KD_SMEM_SCALE
#define KD_SMEM_SCALE 213504  // of the rows' rescale factors ([2][BLOCK_M]) and Q row scales ([BLOCK_M])
#endif
#ifndef KD_SMEM_BAR
#define KD_SMEM_BAR 214272  // of the copies' mbarriers ([4 slots][3 column ranges])
#endif
#ifndef KD_SMEM_ROWS
#define KD_SMEM_ROWS 214368  // of each slot's token rows as cache slot indices ([4][BLOCK_N] u32)
#endif
#ifndef KD_SMEM_WALK
#define KD_SMEM_WALK 215392  // of the CTA's segment walk (KDTREE_SEGMENT_WALK_BYTES)
#endif
#ifndef KD_KV_TMA_BOX_ROWS
#define KD_KV_TMA_BOX_ROWS 64  // rows per TMA box of kdtree_kv_tma's descriptor: min(page size, BLOCK_N)
#endif
#ifndef KD_COMBINE_THREADS
#define KD_COMBINE_THREADS 128  // threads per combine CTA
#endif
#ifndef KD_COMBINE_ROW_THREADS
#define KD_COMBINE_ROW_THREADS 128  // combine threads per row
#endif
