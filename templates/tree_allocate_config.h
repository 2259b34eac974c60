// Compile-time configuration of templates/tree_allocate.cu. The generator defines every
// KD_* value in the prelude it puts before the kernel source (codegen/tree_allocate.cpp),
// and must define exactly these. The defaults (W=64) only let editors and
// `nvcc -fdevice-syntax-only -I templates -I include` read the template alone.

#ifndef KD_MAX_TREE_NODES
#define KD_MAX_TREE_NODES 64  // W: the scores' row stride
#endif
#ifndef KD_THREADS
#define KD_THREADS 1024  // one CTA for the whole batch
#endif
#ifndef KD_MAX_BATCH
#define KD_MAX_BATCH 2048  // requests the CTA's shared memory holds
#endif
