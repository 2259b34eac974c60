// Compile-time configuration of templates/tree_build.cu. The generator defines every
// KD_* value in the prelude it puts before the kernel source (codegen/tree_build.cpp),
// and must define exactly these. The defaults (W=64) only let editors and
// `nvcc -fdevice-syntax-only -I templates -I include` read the template alone.

#ifndef KD_MAX_TREE_NODES
#define KD_MAX_TREE_NODES 64  // W
#endif
#ifndef KD_SLOTS_PER_LANE
#define KD_SLOTS_PER_LANE 2  // ceil(W / 32)
#endif
#ifndef KD_MASK_WORDS
#define KD_MASK_WORDS 1  // ceil(W / 64)
#endif
#ifndef KD_MAX_DEPTH
#define KD_MAX_DEPTH 16  // drafter depth bound
#endif
#ifndef KD_MAX_TOP_K
#define KD_MAX_TOP_K 64  // candidates per depth bound
#endif
