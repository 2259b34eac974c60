#include "codegen/arch.hpp"

#include <algorithm>

#include <cctype>

#include <fmt/format.h>

#include "base/error.hpp"

namespace kdtree::codegen {
namespace {

// Every arch kdtree generates for, with its opt-in shared memory per block / per
// SM (the CUDA programming guide's table of compute capabilities), a typical SM
// count and its machine balance (off-line planning only: A100 312 TFLOP/s over
// 2.04 TB/s, H200 647 over 4.27 (mma.sync), RTX PRO 6000 500 over 1.79, B200 2250
// over 8). sm_120 is the primary target (99 KB / block). An arch outside this
// table is refused: its limits are unknown, so a tile choice could exceed them,
// and NVRTC may not know it either.
struct KnownArch {
  int sm, max_smem_per_block, max_smem_per_sm, num_sms, flop_per_dram_byte;
};
constexpr KnownArch kKnownArches[] = {
    {80, 166912, 167936, 108, 150},  {86, 101376, 102400, 84, 150},   {87, 166912, 167936, 108, 150},
    {89, 101376, 102400, 84, 150},   {90, 232448, 233472, 132, 150},  {100, 232448, 233472, 148, 280},
    {103, 232448, 233472, 148, 280}, {110, 232448, 233472, 148, 280}, {120, 101376, 102400, 188, 280},
    {121, 101376, 102400, 188, 280},
};

}  // namespace

bool has_e4m3_mma(const Arch& arch) { return arch.sm >= 89; }

bool has_block_scaled_e4m3_mma(const Arch& arch) { return arch.sm == 120 || arch.sm == 121; }

std::vector<int> supported_sms() {
  std::vector<int> sms;
  for (const KnownArch& k : kKnownArches) sms.push_back(k.sm);
  return sms;
}

std::string supported_arch_list() {
  std::string list;
  for (const KnownArch& k : kKnownArches) list += (list.empty() ? "sm_" : ", sm_") + std::to_string(k.sm);
  return list;
}

int ctas_per_sm(const Arch& arch, int dynamic_smem, int threads) {
  constexpr int kRegistersPerSm = 65536, kRegistersPerThread = 240, kReservedSmemPerCta = 1024;
  const int by_smem = arch.max_smem_per_sm / (dynamic_smem + kReservedSmemPerCta);
  const int by_registers = kRegistersPerSm / (std::max(threads, 1) * kRegistersPerThread);
  return std::max(1, std::min(by_smem, by_registers));
}

Arch arch_from_sm(int sm) {
  for (const KnownArch& k : kKnownArches) {
    if (k.sm != sm) continue;
    Arch a;
    a.sm = sm;
    a.max_smem_per_block = k.max_smem_per_block;
    a.max_smem_per_sm = k.max_smem_per_sm;
    a.num_sms = k.num_sms;
    a.flop_per_dram_byte = k.flop_per_dram_byte;
    return a;
  }
  const char* why = sm < 80 ? " (kdtree needs sm_80 or newer: mma.sync bf16, cp.async)" : "";
  fail(KDTREE_ERROR_UNSUPPORTED,
       fmt::format("arch sm_{} is not supported{}; supported: {}", sm, why, supported_arch_list()));
}

Arch parse_arch(const std::string& text) {
  std::string digits = text;
  if (digits.rfind("sm_", 0) == 0) digits = digits.substr(3);
  bool ok = !digits.empty() && digits.size() <= 6;  // no stoi overflow; arch_from_sm judges the value
  for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c));
  if (!ok) {
    fail(KDTREE_ERROR_UNSUPPORTED,
         fmt::format("arch '{}' is not understood: use one of {} (or the number alone)", text, supported_arch_list()));
  }
  return arch_from_sm(std::stoi(digits));
}

}  // namespace kdtree::codegen
