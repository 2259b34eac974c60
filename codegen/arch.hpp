// The target GPU architecture and the limits that code generation tiles against.
#pragma once
#include <string>

namespace kdtree::codegen {

struct Arch {
  int sm = 120;                      // compute capability * 10, e.g. 90, 120
  int max_smem_per_block = 101376;   // opt-in dynamic shared memory, bytes
  int max_smem_per_sm = 102400;
  int num_sms = 188;                 // run-time planning only; not part of the key

  std::string name() const { return "sm_" + std::to_string(sm); }
};

// Limits of a known arch (no device needed). Throws UNSUPPORTED below sm_80.
Arch arch_from_sm(int sm);

// Parses "sm_120", "sm_90", "120", "90". Throws UNSUPPORTED with the accepted forms.
Arch parse_arch(const std::string& text);

}  // namespace kdtree::codegen
