/*
 * kdtree: kernels that verify speculative-decoding draft trees.
 *
 * C ABI. Every function returns a kdtree_status (KDTREE_OK = 0); on failure
 * kdtree_last_error() returns a thread-local message that names what was wrong.
 *
 * Conventions (all operations):
 *  - Pointers named "device" are CUDA device pointers (cudaMalloc / cuMemAlloc /
 *    torch tensors); the caller owns every buffer. kdtree never allocates on the
 *    launch path and never synchronises the host with the stream.
 *  - Tensors are contiguous, row-major, in the layout given beside each field.
 *  - `stream` is a CUstream / cudaStream_t; NULL means the legacy default stream.
 *  - A runtime is bound to one device and may be used from several threads.
 */
#ifndef KDTREE_H
#define KDTREE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdtree_status {
  KDTREE_OK = 0,
  KDTREE_ERROR_INVALID_ARGUMENT = 1, /* null pointer, bad size, malformed tree ... */
  KDTREE_ERROR_UNSUPPORTED = 2,      /* a spec outside what kdtree generates */
  KDTREE_ERROR_COMPILE = 3,          /* NVRTC failed; the message holds the log */
  KDTREE_ERROR_CACHE = 4,            /* the disk cache could not be used */
  KDTREE_ERROR_NO_DRIVER = 5,        /* libcuda.so.1 could not be loaded */
  KDTREE_ERROR_NO_DEVICE = 6,        /* no such CUDA device */
  KDTREE_ERROR_DRIVER = 7,           /* a CUDA driver call failed */
  KDTREE_ERROR_INTERNAL = 8
} kdtree_status;

/* Any other integer stored in a kdtree_dtype field (e.g. from ctypes) is refused
 * with KDTREE_ERROR_INVALID_ARGUMENT naming the field and the value; a listed dtype
 * that an operation does not take is KDTREE_ERROR_UNSUPPORTED. */
typedef enum kdtree_dtype {
  KDTREE_DTYPE_BF16 = 0,
  KDTREE_DTYPE_F16 = 1,
  KDTREE_DTYPE_F32 = 2 /* sample_tokens logits only */
} kdtree_dtype;

/* KDTREE_DEVICE_ERROR_*: the bits kernels set in the optional device word
 * `error_flags` (its own header, plain C with no includes, so the kernels'
 * sources include it too). */
#include "kdtree/kdtree_device_errors.h"

/* The largest max_kv_len (KV tokens of one request) verify_attention takes: 2^30.
 * KV positions, split sizes and page counts are 32-bit on the device; the bound
 * leaves room for a split rounded up to whole tiles. */
#define KDTREE_MAX_KV_LEN (1 << 30)

/* The element type of verify_attention's KV caches (kdtree_verify_spec.kv_dtype).
 * Zero, the default of a zero-initialised spec, means the caches hold `dtype`. */
typedef enum kdtree_kv_dtype {
  KDTREE_KV_DTYPE_AS_Q = 0, /* bf16 or f16 caches, the same type as q and out */
  KDTREE_KV_DTYPE_E4M3 = 1  /* fp8 e4m3 (OCP, finite, max 448) caches: value = stored x k_scale (K) or
                               x v_scale (V); q and out stay `dtype`. MLA: one 576-byte row per token
                               (latent 512 + rope 64), V = its first 512 bytes with v_scale. */
} kdtree_kv_dtype;
/* e4m3 caches, in full:
 *  - Codes are OCP e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
 *    infinities; 0x7f / 0xff are NaN; the largest finite value is 448. Write them
 *    with round-to-nearest-even, saturating (cvt.rn.satfinite; torch's
 *    float8_e4m3fn). A NaN code in a row that a request reads makes its output NaN.
 *  - One float scale per cache: K value = code x k_scale, V value = code x v_scale,
 *    both positive and finite (0, negative, NaN or inf: KDTREE_ERROR_INVALID_ARGUMENT
 *    naming the scale and its value). 16-bit caches take k_scale and v_scale 0 or 1
 *    (a zero-initialised struct), anything else is KDTREE_ERROR_INVALID_ARGUMENT:
 *    scales apply to e4m3 caches only.
 *  - Layouts as for 16-bit caches with 1-byte elements: MLA [num_pages, page_size,
 *    1, 576] (V = the first 512 bytes of each row, with v_scale); GQA k_cache and
 *    v_cache [num_pages, page_size, num_kv_heads, 64/128/256]. Caches 16-byte aligned.
 *  - Every supported arch (sm_80+) takes them, by one of two paths:
 *    dequantising (sm_80 .. sm_110, sm_90's GQA): the rows are dequantised exactly
 *    to q's 16-bit type on their way to the tensor cores (16-bit tensor rate); the
 *    e4m3 MMA path (sm_120/sm_121 and sm_90's MLA; KDTREE_VERIFY_TILES "mma=e4m3"
 *    forces it on sm_89 and newer, "mma=16bit" the other): q quantised to e4m3 per
 *    (node, head) row (scale = max |q| / 448) and P (the softmax numerators,
 *    <= 256) to e4m3, QK and PV on e4m3 tensor cores with fp32 accumulation at
 *    twice the bf16 rate (sm_120/sm_121: the block-scaled mma.sync; sm_90: wgmma).
 *  - Accuracy against a float64 reference over the dequantised cache:
 *    dequantising path: that of a 16-bit cache holding the dequantised values
 *    (Q and P stay 16-bit): relative error of out within 1e-2 (measured worst on
 *    the H200 parity grid: 2.4e-3 with bf16 q, 3.0e-4 with f16 q).
 *    e4m3 MMA path: rounding q to e4m3 (relative error <= 2^-4 per element) moves
 *    each score by at most 2^-4 x sm_scale x k_scale x sum_i |q_i k_i|, and the
 *    LSE by at most the largest such move over the row's visible tokens (tested,
 *    plus 1e-2); P's rounding (<= 2^-4 relative per weight) and q's make out's
 *    relative (L2, per request) error at most 0.1 on the parity grid (measured
 *    worst on the H200: 6.4e-2 with bf16 q, 4.6e-2 with f16 q). Quantising a model's
 *    KV to e4m3 is the caller's error, not counted here. A NaN code (0x7f, 0xff)
 *    in a row that is read gives a wrong value (finite on the dequantising path,
 *    NaN on the e4m3 MMA path): caches must hold finite codes.
 *  - kv_compact moves e4m3 rows too (kdtree_kv_compact_args.kv_dtype). */

typedef struct kdtree_runtime kdtree_runtime;

/* Library version "MAJOR.MINOR.PATCH"; static storage. */
const char* kdtree_version(void);

/* What kdtree generates, as one JSON object (static storage, never NULL):
 * {"heads":[{"name":"mla576/512","head_dim_qk":576,"head_dim_v":512,"mla":true},
 *           {"name":"gqa64",...},...],
 *  "widths":[16,32,64,128],            max_tree_nodes W (every operation)
 *  "page_sizes":[1,16,32,64,128],      verify_attention and kv_compact
 *  "dtypes":["bf16","f16"],            q / caches / out of verify_attention and kv_compact
 *  "kv_dtypes":["as_q","e4m3"],        verify_attention's caches (kdtree_kv_dtype) and kv_compact's rows
 *  "archs":["sm_80",...,"sm_121"],
 *  "default_grid":{...}}               what `kdtree-gen warm` compiles without grid options (heads, widths,
 *                                      page_sizes, dtypes, kv_dtypes)
 * The one list of these values; bindings read it instead of keeping their own. */
const char* kdtree_supported_shapes_json(void);

/* Thread-local message of the last failed call on this thread ("" if none has
 * failed). Successful calls leave it unchanged, so it is only meaningful right
 * after a call returned a status other than KDTREE_OK. Valid until the next
 * failing call on this thread. */
const char* kdtree_last_error(void);

/* Creates a runtime for CUDA device `device` (>= 0). The driver is loaded at first
 * device use, so creation succeeds on a machine without a GPU; launching then
 * fails with KDTREE_ERROR_NO_DRIVER / KDTREE_ERROR_NO_DEVICE.
 * cache_dir_or_null: cubin cache directory; NULL = $KDTREE_CACHE_DIR, else
 * $XDG_CACHE_HOME/kdtree, else ~/.cache/kdtree. A directory that cannot be
 * written (or none at all) means caching in memory, with one warning on stderr.
 * The cache is kept under $KDTREE_CACHE_MAX_BYTES (default 2 GiB, LRU eviction);
 * a kernel another process is compiling is waited for at most
 * $KDTREE_CACHE_LOCK_TIMEOUT seconds (default 60), then compiled here. A
 * malformed value of either variable: KDTREE_ERROR_INVALID_ARGUMENT. */
kdtree_status kdtree_runtime_create(int device, const char* cache_dir_or_null, kdtree_runtime** out);

/* A runtime that only generates and compiles (no device) for the given arch,
 * e.g. 120 for sm_120, 90 for sm_90. Used by kdtree-gen warm. Supported arches:
 * 80, 86, 87, 89, 90, 100, 103, 110, 120, 121; any other value is
 * KDTREE_ERROR_UNSUPPORTED with that list (so is a device runtime's GPU outside it,
 * at first device use). */
kdtree_status kdtree_runtime_create_offline(int sm_arch, const char* cache_dir_or_null, kdtree_runtime** out);

kdtree_status kdtree_runtime_destroy(kdtree_runtime* rt);

/* Makes the device's primary context (the one the CUDA runtime and PyTorch use)
 * current on the calling thread; loads the driver. Programs that allocate with
 * the Driver API call this before cuMemAlloc. */
kdtree_status kdtree_runtime_bind_context(kdtree_runtime* rt);

/* The sm arch the runtime compiles for (e.g. 90, 120). Queries the device when
 * the runtime is bound to one (loads the driver). */
kdtree_status kdtree_runtime_arch(kdtree_runtime* rt, int* sm_arch);

/* ---------------------------------------------------------------- verify_attention */

/* The compile-time shape of a verify_attention kernel. num_q_heads and
 * num_kv_heads are run-time values (not part of the kernel key) but live here
 * because every call needs them; num_q_heads is 1..1024.
 *  MLA (absorbed): head_dim_qk 576, head_dim_v 512, num_kv_heads 1, v_cache NULL.
 *  GQA/MHA: head_dim_qk == head_dim_v in {64, 128, 256}; num_q_heads % num_kv_heads == 0. */
typedef struct kdtree_verify_spec {
  int head_dim_qk;
  int head_dim_v;
  int num_q_heads;
  int num_kv_heads;
  int page_size;            /* 1, 16, 32, 64, 128 */
  int max_tree_nodes;       /* W: 16, 32, 64, 128 */
  kdtree_dtype dtype;       /* of q and out (and of the caches with kv_dtype AS_Q): BF16 or F16 */
  kdtree_kv_dtype kv_dtype; /* of k_cache and v_cache: KDTREE_KV_DTYPE_AS_Q (0) or KDTREE_KV_DTYPE_E4M3; any other
                               integer is KDTREE_ERROR_INVALID_ARGUMENT naming kv_dtype */
} kdtree_verify_spec;

/* Device pointers are aligned as their comments say (q, k_cache, v_cache and workspace 16
 * bytes; out and tree_mask 8; the int32 arrays and lse 4): a misaligned one is
 * KDTREE_ERROR_INVALID_ARGUMENT naming it. out, lse, workspace and error_flags are
 * written: each must be a buffer of its own (sharing memory is refused, naming both). */
typedef struct kdtree_verify_args {
  kdtree_verify_spec spec;
  int batch_size;             /* >= 1; batch_size * num_kv_heads <= 65535 (one CTA row per request and KV head) */
  int total_nodes;            /* = node_indptr[batch_size]; host copy, sizes out and lse; batch_size..batch_size *
                                 max_tree_nodes, and total_nodes * num_q_heads <= 2^31 - 1 */
  int max_kv_len;             /* host upper bound of kv_lens[b], 1..2^30 (KDTREE_MAX_KV_LEN); plans the KV split */
  int num_pages;              /* physical pages in the caches; page ids are checked against it */
  const void* q;              /* device, 16-byte aligned [total_nodes, num_q_heads, head_dim_qk] */
  const int32_t* node_indptr; /* device [batch_size + 1]; request b owns nodes [indptr[b], indptr[b+1]) */
  const void* k_cache; /* device, 16-byte aligned [num_pages, page_size, num_kv_heads, head_dim_qk] of kv_dtype */
  const void* v_cache; /* device, 16-byte aligned [num_pages, page_size, num_kv_heads, head_dim_v]; NULL for MLA */
  const int32_t* page_table; /* device [batch_size, max_pages_per_req] */
  int max_pages_per_req;
  const int32_t* kv_lens;    /* device [batch_size]: prefix + tree nodes */
  const uint64_t* tree_mask; /* device [total_nodes, ceil(max_tree_nodes / 64)] */
  float sm_scale;            /* > 0, e.g. 1/sqrt(head_dim_qk) */
  void* out;                 /* device, 8-byte aligned [total_nodes, num_q_heads, head_dim_v] */
  float* lse;                /* device [total_nodes, num_q_heads], natural log; may be NULL */
  void* workspace; /* device, 16-byte aligned, >= kdtree_verify_workspace_size bytes; may be NULL if that is 0 */
  size_t workspace_size;
  int32_t* error_flags; /* device int32, optional: KDTREE_DEVICE_ERROR_* bits are OR-ed in */
  void* stream;         /* CUstream; NULL = default stream */
  int num_splits;       /* 0 = chosen from the shape and SM count; 1..65535 forces it (splits past kv_len stay idle) */
  float k_scale;        /* e4m3 caches: K value = stored x k_scale; positive and finite. 16-bit caches: 0 or 1 */
  float v_scale;        /* e4m3 caches: V value = stored x v_scale (MLA: of the same row's first 512 bytes);
                           positive and finite. 16-bit caches: 0 or 1 */
} kdtree_verify_args;

/* Workspace bytes a verify_attention call with these host-known sizes needs
 * (num_splits = 0, the automatic choice); 0 where its plan needs none (one split,
 * or splits merged in a thread-block cluster: sm_90's MLA kernels at two splits).
 * A call that forces num_splits = S > 1
 * needs S * total_nodes * num_q_heads * (head_dim_v * 2 + 4) bytes: per split
 * and (node, head), the partial output row in q's 16-bit type and its fp32 LSE. */
kdtree_status kdtree_verify_workspace_size(kdtree_runtime* rt, const kdtree_verify_spec* spec, int batch_size,
                                           int total_nodes, int max_kv_len, size_t* bytes);

kdtree_status kdtree_verify_attention(kdtree_runtime* rt, const kdtree_verify_args* args);

/* Compiles (or loads from the cache) every kernel a spec needs (its kv_dtype
 * included), ahead of time. kdtree_verify_workspace_size plans with the spec's
 * kv_dtype too. */
kdtree_status kdtree_warm(kdtree_runtime* rt, const kdtree_verify_spec* spec);

/* ---------------------------------------------------------------- tree operations */

/* Tree ops use the padded per-request layout: request b's nodes are rows
 * [b * max_tree_nodes, b * max_tree_nodes + node_counts[b]); rows past the count
 * are written as -1 (ids) / 0 (mask words). The outputs of one call (and
 * error_flags) must not share memory: that is KDTREE_ERROR_INVALID_ARGUMENT naming
 * both. */
typedef struct kdtree_tree_build_args {
  int batch_size;
  int depth;                   /* D: drafter depth, 1..16 */
  int top_k;                   /* K: candidates per depth, 1..64 */
  int budget;                  /* draft nodes to select, 1..max_tree_nodes-1 */
  int max_tree_nodes;          /* W: 16, 32, 64, 128 */
  const int32_t* draft_tokens; /* device [B, D, K] */
  const float* draft_logprobs; /* device [B, D, K], descending along K */
  const int32_t* root_tokens;  /* device [B] */
  const int32_t* prefix_lens;  /* device [B]: position of the root */
  int32_t* tokens;             /* device [B, W] */
  int32_t* parents;            /* device [B, W], root -1 */
  int32_t* depths;             /* device [B, W], root 0 */
  int32_t* positions;          /* device [B, W] = prefix_len + depth */
  uint64_t* tree_mask;         /* device [B, W, ceil(W/64)] */
  int32_t* first_child;        /* device [B, W], -1 = none */
  int32_t* next_sibling;       /* device [B, W], -1 = none */
  int32_t* node_counts;        /* device [B]: 1 + selected draft nodes */
  float* scores;               /* device [B, W] path log-prob, optional (NULL) */
  void* stream;
} kdtree_tree_build_args;

kdtree_status kdtree_tree_build(kdtree_runtime* rt, const kdtree_tree_build_args* args);

/* Device-side checks, per request b (a failing request gets its bit in error_flags,
 * accepted_path row all -1, accept_lens[b] = bonus_tokens[b] = -1; other requests
 * are unaffected): node_counts[b] in 1..max_tree_nodes, else
 * KDTREE_DEVICE_ERROR_NODE_COUNT; with node_indptr, also 0 <= node_indptr[b],
 * node_indptr[b + 1] - node_indptr[b] == node_counts[b] and
 * node_indptr[b + 1] <= total_nodes, else KDTREE_DEVICE_ERROR_NODE_COUNT (so
 * target_tokens is never read past total_nodes); then parents[b, 0] == -1 and
 * 0 <= parents[b, i] < i, else KDTREE_DEVICE_ERROR_TREE. */
typedef struct kdtree_tree_accept_args {
  int batch_size;
  int max_tree_nodes;
  const int32_t* tokens;        /* device [B, W] (tree_build layout) */
  const int32_t* parents;       /* device [B, W] */
  const int32_t* node_counts;   /* device [B] */
  const int32_t* target_tokens; /* device: [B, W] padded, or packed [total_nodes] when node_indptr != NULL */
  const int32_t* node_indptr;   /* device [B + 1] or NULL */
  int32_t* accepted_path;       /* device [B, W]: node ids, root first, -1 padded */
  int32_t* accept_lens;         /* device [B]: accepted draft tokens (path length - 1) */
  int32_t* bonus_tokens;        /* device [B]: target token at the last accepted node */
  int32_t* error_flags;         /* optional device int32 */
  void* stream;
  /* Elements of packed target_tokens (= node_indptr[batch_size]), host copy.
   * Required with node_indptr: batch_size..batch_size * max_tree_nodes, and a
   * call that leaves it 0 is refused (KDTREE_ERROR_INVALID_ARGUMENT), since the
   * kernel could not otherwise bound its reads. Ignored (may be 0) when
   * node_indptr is NULL: padded targets are [B, W]. Last member so that the
   * fields before it keep their offsets. */
  int total_nodes;
} kdtree_tree_accept_args;

kdtree_status kdtree_tree_accept(kdtree_runtime* rt, const kdtree_tree_accept_args* args);

/* The draft nodes a round verifies, allocated over the batch (a round that
 * verifies B + total nodes for the whole batch instead of a fixed budget per
 * request): of the draft nodes 1..cap of every request's tree_build tree, the
 * `total` of highest value, at most cap per request, where
 *   value = scores[b, node] + urgency * ln(max(remaining[b], 1) / M)
 * (M the batch's largest max(remaining, 1); in float32), and requests with
 * active[b] == 0 take nodes only after every active one. Equal values go to the
 * lower request, then the lower node. tree_build builds each request's tree
 * best first, so its nodes 1..cap (a tree built at budget >= cap) have
 * non-increasing scores and the chosen nodes are a prefix of every tree.
 * Outputs (all device, written by one CTA):
 *   node_counts [B]: 1 + the draft nodes of request b (tree_accept's and
 *     kv_compact's node_counts; the root is always kept);
 *   node_indptr [B + 1]: their prefix sums from 0, node_indptr[B] = B + total
 *     (verify_attention's and tree_accept's packed layout);
 *   row_req, row_node [B + total] int64: packed row r is node row_node[r] of
 *     request row_req[r] (gather tree_build's per-node outputs with them).
 * A score that is NaN or higher than the node before it (within 1..cap) sets
 * KDTREE_DEVICE_ERROR_SCORES; every request then keeps its root only
 * (node_counts 1, node_indptr[b] = b) and rows from B on are (0, 0).
 * batch_size 1..2048; max_tree_nodes (the scores' row stride) 16, 32, 64 or
 * 128; cap 1..max_tree_nodes - 1; total 0..batch_size * cap; urgency finite
 * and >= 0. No host synchronisation: safe inside CUDA-graph capture. */
typedef struct kdtree_tree_allocate_args {
  int batch_size;
  int max_tree_nodes;
  int cap;                  /* most draft nodes per request */
  int total;                /* draft nodes over the batch */
  const float* scores;      /* device [B, W] float32 (tree_build's scores) */
  const uint8_t* active;    /* device [B] 0/1 (torch.bool), or NULL: every request active */
  const int32_t* remaining; /* device [B] tokens each request has left, or NULL: value = score */
  float urgency;            /* the log weight's factor (0: by score alone) */
  int32_t* node_counts;     /* device [B] */
  int32_t* node_indptr;     /* device [B + 1] */
  int64_t* row_req;         /* device [B + total] */
  int64_t* row_node;        /* device [B + total] */
  int32_t* error_flags;     /* optional device int32 */
  void* stream;
} kdtree_tree_allocate_args;

kdtree_status kdtree_tree_allocate(kdtree_runtime* rt, const kdtree_tree_allocate_args* args);

typedef struct kdtree_sample_args {
  int num_rows;
  int vocab_size;
  kdtree_dtype logits_dtype; /* BF16 or F32 */
  const void* logits;        /* device [num_rows, row_stride] */
  int64_t row_stride;        /* elements; 0 = vocab_size */
  float temperature;         /* <= 0 (-inf too), or so small that 1 / temperature is not finite: greedy argmax
                                (lowest index wins ties); NaN and +inf: KDTREE_ERROR_INVALID_ARGUMENT */
  uint64_t seed;
  const int64_t* row_offsets; /* device [num_rows] RNG offsets, or NULL = row index */
  int32_t* out_tokens;        /* device [num_rows] */
  void* stream;
} kdtree_sample_args;

kdtree_status kdtree_sample_tokens(kdtree_runtime* rt, const kdtree_sample_args* args);

/* Moves the accepted path's rows of every layer's caches (one launch). Rows are
 * copied as bytes, so any row of a multiple of 16 bytes moves: 16-bit rows
 * (row_elems a multiple of 8; MLA 576, GQA num_kv_heads x 64/128/256) and e4m3
 * rows (kv_dtype E4M3: row_elems a multiple of 16; MLA 576 bytes, GQA
 * num_kv_heads x 64/128/256 bytes), of at most 1 GiB. The scales of e4m3 caches
 * are per cache, so they do not move. num_layers and batch_size are 1..65535.
 * The per-layer cache pointers are read on the device, where nothing checks
 * them: each must be non-NULL and 16-byte aligned (rows move as 16-byte
 * vectors), and no two layers' caches (K or V) may share memory (their rows are
 * moved concurrently). The Python package checks both. */
typedef struct kdtree_kv_compact_args {
  int num_layers;
  int batch_size;
  int max_tree_nodes;
  int page_size;
  int num_pages;
  int row_elems_k;           /* elements per token row of a K (or MLA) cache: num_kv_heads * head_dim */
  int row_elems_v;           /* elements per token row of a V cache; 0 for MLA */
  kdtree_dtype dtype;        /* BF16 or F16 (always checked; the element size comes from kv_dtype) */
  const uint64_t* k_caches;  /* device [num_layers] device pointers to [num_pages, page_size, row] */
  const uint64_t* v_caches;  /* device [num_layers] or NULL (MLA) */
  const int32_t* page_table; /* device [B, max_pages_per_req] */
  int max_pages_per_req;
  const int32_t* kv_lens;       /* device [B]: before compaction (prefix + n_b) */
  const int32_t* node_counts;   /* device [B]: n_b */
  const int32_t* accepted_path; /* device [B, W]: root first */
  const int32_t* accept_lens;   /* device [B]: path length - 1 */
  int32_t* error_flags;         /* optional device int32 */
  void* stream;
  /* The caches' element type: KDTREE_KV_DTYPE_AS_Q (0, 2-byte `dtype` elements)
   * or KDTREE_KV_DTYPE_E4M3 (1-byte elements); any other value is
   * KDTREE_ERROR_INVALID_ARGUMENT. Last member so that the fields before it
   * keep their offsets. */
  kdtree_kv_dtype kv_dtype;
} kdtree_kv_compact_args;

kdtree_status kdtree_kv_compact(kdtree_runtime* rt, const kdtree_kv_compact_args* args);

#ifdef __cplusplus
}
#endif
#endif /* KDTREE_H */
