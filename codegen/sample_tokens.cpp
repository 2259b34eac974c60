#include "codegen/sample_tokens.hpp"

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/tree_ops_common.hpp"

namespace kdtree::codegen {
namespace {

const char* logits_name(kdtree_dtype dtype) {
  switch (dtype) {
    case KDTREE_DTYPE_BF16: return "bf16";
    case KDTREE_DTYPE_F16: return "f16";
    case KDTREE_DTYPE_F32: return "f32";
  }
  return "unknown";
}

// 16-byte loads in flight per thread: with 1024 threads, 64 KB per CTA, enough
// to cover DRAM latency with one or two CTAs per SM.
constexpr int kSampleUnroll = 4;

}  // namespace

std::string SampleSpec::label() const { return fmt::format("sample_tokens[{}]", logits_name(logits_dtype)); }

std::string SampleSpec::fast_key() const { return fmt::format("sample_tokens:{}", logits_name(logits_dtype)); }

void validate(const SampleSpec& spec) {
  if (spec.logits_dtype != KDTREE_DTYPE_BF16 && spec.logits_dtype != KDTREE_DTYPE_F32) {
    fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("sample_tokens: logits dtype {} ({}) is not supported: use BF16 or F32",
                                               logits_name(spec.logits_dtype), static_cast<int>(spec.logits_dtype)));
  }
}

KernelSource generate_sample_tokens(const SampleSpec& spec, const Arch& arch) {
  validate(spec);
  (void)arch;  // the kernel is the same for every supported arch
  Params params{
      {"THREADS", std::to_string(kSampleThreads)},
      {"UNROLL", std::to_string(kSampleUnroll)},
      {"LOGITS_BF16", spec.logits_dtype == KDTREE_DTYPE_BF16 ? "1" : "0"},
  };
  const std::string file_stem = fmt::format("sample_tokens-{}", logits_name(spec.logits_dtype));
  return tree_op_source("sample_tokens", spec.label(), file_stem, params, kSampleThreads);
}

}  // namespace kdtree::codegen
