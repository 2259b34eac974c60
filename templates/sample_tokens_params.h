/* Launch parameters of the generated sample_tokens kernel. Plain C, shared by the
 * host (runtime/sample_tokens.cpp) and the device code, so the layout has one
 * definition. Passed by value as the kernel's only argument. */
#ifndef KDTREE_SAMPLE_TOKENS_PARAMS_H
#define KDTREE_SAMPLE_TOKENS_PARAMS_H

typedef struct kdtree_sample_tokens_params {
  const void* logits;           /* [num_rows, row_stride], bf16 or f32 */
  const long long* row_offsets; /* [num_rows] RNG offsets, or 0 = row index */
  int* out_tokens;              /* [num_rows] */
  long long row_stride;         /* elements */
  unsigned long long seed;
  int num_rows;
  int vocab_size;
  float inv_temperature; /* 1 / T (sampling only) */
  int greedy;            /* 1: argmax, lowest index wins ties */
} kdtree_sample_tokens_params;

#endif
