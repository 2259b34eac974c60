// Compile-time configuration of templates/verify_attention_wgmma_gqa.cu. The generator defines
// every KD_* value in the prelude it puts before the kernel source (codegen/verify_attention.cpp),
// and must define exactly these. The defaults (gqa128, W=64, page 64, bf16, sm_90a's tiles
// kernel=wgmma,block_m=128,block_n=128,warps=8,stages=3,warp_rows=16) only let editors and
// `nvcc -arch=sm_90a -fdevice-syntax-only -I templates -I include` read the template alone.

#ifndef KD_HEAD_DIM_QK
#define KD_HEAD_DIM_QK 128  // Q/K head dim
#endif
#ifndef KD_HEAD_DIM_V
#define KD_HEAD_DIM_V 128  // V head dim (GQA: the same)
#endif
#ifndef KD_PAGE_SIZE
#define KD_PAGE_SIZE 64  // tokens per KV page
#endif
#ifndef KD_MAX_TREE_NODES
#define KD_MAX_TREE_NODES 64  // W
#endif
#ifndef KD_IS_MLA
#define KD_IS_MLA false  // GQA: separate K and V caches
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
#define KD_BLOCK_M 128  // rows (node x query head of one KV head) per CTA: 64 per consumer warpgroup
#endif
#ifndef KD_BLOCK_N
#define KD_BLOCK_N 128  // KV tokens per tile (64 for 256-dim heads)
#endif
#ifndef KD_WARPS_M
#define KD_WARPS_M 8  // consumer warps, 16 rows each (two warpgroups)
#endif
#ifndef KD_WARPS_N
#define KD_WARPS_N 1  // every consumer warp takes all columns
#endif
#ifndef KD_WARP_ROWS
#define KD_WARP_ROWS 16  // rows per warp (wgmma's m64 over 4 warps)
#endif
#ifndef KD_STAGES
#define KD_STAGES 3  // K/V tile stages the producer warpgroup fills ahead
#endif
#ifndef KD_SMEM_K
#define KD_SMEM_K 32768  // byte offset of the K stages (Q's tile at 0)
#endif
#ifndef KD_SMEM_V
#define KD_SMEM_V 131072  // of the V stages
#endif
#ifndef KD_SMEM_BAR
#define KD_SMEM_BAR 229376  // of the stages' mbarriers ([STAGES] each: K full, K empty, V full, V empty)
#endif
#ifndef KD_SMEM_RAW
#define KD_SMEM_RAW 229376  // e4m3 caches: of the tiles' cache bytes (K rows, then V rows), before the mbarriers
#endif
#ifndef KD_RAW_STAGES
#define KD_RAW_STAGES 0  // e4m3 caches: tiles of cache bytes in flight (1 or 2; 0 for 16-bit caches)
#endif
#ifndef KD_COMBINE_THREADS
#define KD_COMBINE_THREADS 128  // threads per combine CTA
#endif
#ifndef KD_COMBINE_ROW_THREADS
#define KD_COMBINE_ROW_THREADS 32  // combine threads per row
#endif
