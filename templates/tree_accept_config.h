// Compile-time configuration of templates/tree_accept.cu. The generator defines every
// KD_* value in the prelude it puts before the kernel source (codegen/tree_accept.cpp),
// and must define exactly these. The defaults (W=64) only let editors and
// `nvcc -fdevice-syntax-only -I templates -I include` read the template alone.

#ifndef KD_MAX_TREE_NODES
#define KD_MAX_TREE_NODES 64  // W
#endif
#ifndef KD_NODES_PER_LANE
#define KD_NODES_PER_LANE 2  // ceil(W / 32)
#endif
