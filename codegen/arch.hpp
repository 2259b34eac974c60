// The target GPU architecture and the limits that code generation tiles against.
#pragma once
#include <string>
#include <vector>

namespace kdtree::codegen {

struct Arch {
  int sm = 120;                     // compute capability * 10, e.g. 90, 120
  int max_smem_per_block = 101376;  // opt-in dynamic shared memory, bytes
  int max_smem_per_sm = 102400;
  int num_sms = 188;  // run-time planning only; not part of the key
  // Dense bf16 tensor FLOP/s per DRAM byte/s (the machine balance; planning only:
  // what writing a byte of split partials costs against a tile of math).
  int flop_per_dram_byte = 280;

  std::string name() const { return "sm_" + std::to_string(sm); }
};

// CTAs of `threads` threads and `dynamic_smem` bytes that one SM holds at once (at
// least 1): by shared memory (1 KB reserved per CTA) and by registers (kernels are
// budgeted at 240 per thread). The one occupancy estimate the tile choice and the
// split planner use.
int ctas_per_sm(const Arch& arch, int dynamic_smem, int threads);

// e4m3 tensor-core MMAs (mma.sync m16n8k32 e4m3): sm_89 and newer. Native (QMMA)
// on sm_120/sm_121 only: on sm_89/sm_90 and the sm_100 family (whose fp8 tensor
// path is tcgen05) ptxas converts each to f16 HMMAs.
bool has_e4m3_mma(const Arch& arch);
// The block-scaled kind::mxf8f6f4 e4m3 MMA at twice the bf16 rate: sm_120/sm_121,
// compiled for the arch-specific target (sm_120a, sm_121a).
bool has_block_scaled_e4m3_mma(const Arch& arch);

// Limits of a supported arch (no device needed). Throws UNSUPPORTED, listing the
// supported arches, for any other value (below sm_80, or unknown like sm_999).
Arch arch_from_sm(int sm);

// The supported arches, ascending: {80, 86, 87, 89, 90, 100, 103, 110, 120, 121}.
std::vector<int> supported_sms();
// The same as text for messages: "sm_80, sm_86, ..., sm_121".
std::string supported_arch_list();

// Parses "sm_120", "sm_90", "120", "90". Throws UNSUPPORTED with the accepted forms
// and the supported arches.
Arch parse_arch(const std::string& text);

}  // namespace kdtree::codegen
