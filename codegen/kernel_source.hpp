// What a generator produces: one CUDA translation unit, ready for NVRTC.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace kdtree::codegen {

// How the generated kernels are launched, decided by the generator together with
// the source, so the host reads it here rather than recomputing or mirroring it.
// Fields an operation does not use stay 0.
struct LaunchFacts {
  std::string kernel;       // verify_attention: the family and tiles, as VerifyTiles::str() (logs, tools)
  int threads = 0;          // threads per CTA of entry_points[0]
  int dynamic_smem = 0;     // dynamic shared memory of entry_points[0], bytes
  int block_m = 0;          // verify_attention: (node, head) rows per CTA
  int block_n = 0;          // verify_attention: KV tokens per tile (a split is a multiple of it)
  int kv_row_bytes = 0;     // verify_attention: cached bytes a token takes per KV head (VerifySpec::kv_row_bytes)
  int combine_threads = 0;  // verify_attention: threads per CTA of kdtree_verify_combine
  int combine_rows = 0;     // verify_attention: (node, head) rows per combine CTA
  bool stream_k = false;    // verify_attention: the kernel runs stream-K launches (kdtree_verify_params.stream_ctas)
  // verify_attention: the kernel can merge uniform splits inside a thread-block cluster
  // (kdtree_verify_params.cluster_splits; launched as clusters on sm_90+ only)
  bool cluster_merge = false;
  // verify_attention: the planner runs a uniform plan of two splits as one cluster (no
  // partials, no combine) unless KDTREE_VERIFY_SCHEDULE says otherwise: measured faster
  // on the H200 for sm_90's MLA wgmma kernels (docs/PERFORMANCE.md)
  bool cluster_two_splits = false;
  // verify_attention: the kernel's KV-tile throughput as a fraction of the arch's dense
  // 16-bit tensor rate (Arch::flop_per_dram_byte's FLOPs), as the planner converts bytes
  // (the KV's floor, the split partials) into tile times
  double tensor_rate = 0.5;
  // verify_attention: a stream-K segment's fixed work (Q, the first copies, the partial
  // rows), in KV tile times, as the planner weighs stream-K against uniform splits
  double stream_segment_tiles = 1.5;
  // verify_attention: > 0 when the kernel copies whole KV tiles by TMA: rows per box of the
  // cache's descriptor, which the host encodes and passes as the main kernel's second
  // parameter (templates/verify_attention_tma.h; enabled = 0 keeps the kernel on cp.async)
  int kv_tma_box_rows = 0;
};

struct KernelSource {
  std::string op;         // "verify_attention", "tree_build", ...
  std::string label;      // grid-point name: "verify_attention[mla576/512,W=64,page=64,bf16]"
  std::string file_stem;  // file-name-safe: "verify_attention-mla576x512-W64-p64-bf16"
  std::string source;     // CUDA C++: a prelude, then templates/<op>.cu
  // The headers `source` includes, handed to NVRTC by name: {name, text}.
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> entry_points;  // extern "C" __global__ names
  std::vector<std::string> options;       // NVRTC options except the arch
  // Compiled for the arch-specific target (sm_120a): instructions of exactly that
  // arch (the block-scaled e4m3 MMA); the cubin loads on that compute capability only.
  bool arch_specific = false;
  LaunchFacts launch;
};

}  // namespace kdtree::codegen
