// Compile-time configuration of templates/kv_compact.cu. The generator defines every
// KD_* value in the prelude it puts before the kernel source (codegen/kv_compact.cpp),
// and must define exactly these. The defaults (W=64, page 64) only let editors and
// `nvcc -fdevice-syntax-only -I templates -I include` read the template alone.

#ifndef KD_PAGE_SIZE
#define KD_PAGE_SIZE 64  // tokens per KV page
#endif
#ifndef KD_MAX_TREE_NODES
#define KD_MAX_TREE_NODES 64  // W
#endif
#ifndef KD_THREADS
#define KD_THREADS 128  // threads per CTA
#endif
#ifndef KD_CHUNK_VECS
#define KD_CHUNK_VECS 32  // 16-byte vectors per row chunk (a CTA's columns)
#endif
#ifndef KD_VECS_PER_THREAD
#define KD_VECS_PER_THREAD 4  // vectors a thread holds per round
#endif
