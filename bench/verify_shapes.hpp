// The verify_attention benchmark shapes, shared by bench_verify (measures them on
// a GPU) and verify_plan (prints their launch plans and kernels for the
// performance model in tools/perf_model), so the two never disagree.
#pragma once

namespace kdtree::bench {

struct VerifyShape {
  const char* name;
  int batch, q_heads, kv_heads, nodes, prefix, head_qk, head_v, page;
  double triton_us, eager_us, flashmla_us;  // the reference columns (0 = none)
};

inline constexpr VerifyShape kVerifyShapes[] = {
    {"mla_b1_h16_n16_p4k", 1, 16, 1, 16, 4096, 576, 512, 64, 628, 329, 33.8},
    {"mla_b1_h16_n64_p8k", 1, 16, 1, 64, 8192, 576, 512, 64, 1236, 572, 56.4},
    {"mla_b8_h16_n32_p4k", 8, 16, 1, 32, 4096, 576, 512, 64, 638, 580, 78.3},
    {"mla_b32_h16_n16_p2k", 32, 16, 1, 16, 2048, 576, 512, 64, 1319, 575, 75.6},
    {"mla_b1_h128_n16_p32k", 1, 128, 1, 16, 32768, 576, 512, 64, 4932, 1259, 221},
    {"mla_b4_h128_n64_p8k", 4, 128, 1, 64, 8192, 576, 512, 64, 9903, 5274, 864},
    {"mla_b64_h8_n8_p4k", 64, 8, 1, 8, 4096, 576, 512, 64, 0, 0, 0},
    {"gqa128_b4_g8_n64_p8k", 4, 64, 8, 64, 8192, 128, 128, 16, 0, 0, 0},
    {"gqa64_b4_g8_n64_p8k", 4, 64, 8, 64, 8192, 64, 64, 16, 0, 0, 0},
    {"gqa256_b4_g8_n64_p8k", 4, 32, 4, 64, 8192, 256, 256, 16, 0, 0, 0},
};

// The kernel width a shape runs with: the smallest supported max_tree_nodes >= nodes.
inline int verify_width(int nodes) { return nodes <= 16 ? 16 : nodes <= 32 ? 32 : nodes <= 64 ? 64 : 128; }

}  // namespace kdtree::bench
