#include "codegen/arch.hpp"

#include <cctype>

#include <fmt/format.h>

#include "base/error.hpp"

namespace kdtree::codegen {

Arch arch_from_sm(int sm) {
  if (sm < 80) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("arch sm_{} is not supported: kdtree needs sm_80 or newer (mma.sync bf16, cp.async)", sm));
  }
  Arch a;
  a.sm = sm;
  // Opt-in shared memory per block / per SM, from the CUDA programming guide's
  // table of compute capabilities. sm_120 is the primary target (99 KB / block).
  switch (sm) {
    case 80: case 87: a.max_smem_per_block = 166912; a.max_smem_per_sm = 167936; a.num_sms = 108; break;
    case 90: a.max_smem_per_block = 232448; a.max_smem_per_sm = 233472; a.num_sms = 132; break;
    case 100: case 103: case 110:
      a.max_smem_per_block = 232448; a.max_smem_per_sm = 233472; a.num_sms = 148; break;
    default:  // sm_86, sm_89, sm_120, sm_121 and unknown newer consumer parts: the small budget
      a.max_smem_per_block = 101376; a.max_smem_per_sm = 102400; a.num_sms = sm >= 120 ? 188 : 84; break;
  }
  return a;
}

Arch parse_arch(const std::string& text) {
  std::string digits = text;
  if (digits.rfind("sm_", 0) == 0) digits = digits.substr(3);
  bool ok = !digits.empty() && digits.size() <= 3;
  for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c));
  if (!ok) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("arch '{}' is not understood: use sm_120, sm_90, sm_80 (or the number alone)", text));
  }
  return arch_from_sm(std::stoi(digits));
}

}  // namespace kdtree::codegen
