// Compile-time configuration of templates/sample_tokens.cu. The generator defines every
// KD_* value in the prelude it puts before the kernel source (codegen/sample_tokens.cpp),
// and must define exactly these. The defaults (bf16 logits) only let editors and
// `nvcc -fdevice-syntax-only -I templates -I include` read the template alone.

#ifndef KD_THREADS
#define KD_THREADS 1024  // threads per CTA (one CTA per row)
#endif
#ifndef KD_UNROLL
#define KD_UNROLL 4  // 16-byte loads in flight per thread
#endif
#ifndef KD_LOGITS_BF16
#define KD_LOGITS_BF16 1  // 1: bf16 logits, 0: f32
#endif
