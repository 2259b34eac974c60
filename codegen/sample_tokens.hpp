// sample_tokens: spec validation and source generation. One kernel per logits
// dtype; greedy vs. sampled, temperature, seed and shapes are run-time values.
#pragma once
#include <string>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"
#include "kdtree/kdtree.h"

namespace kdtree::codegen {

struct SampleSpec {
  kdtree_dtype logits_dtype = KDTREE_DTYPE_BF16;

  // "sample_tokens[bf16]"
  std::string label() const;
  std::string fast_key() const;
};

// Throws KDTREE_ERROR_UNSUPPORTED unless the logits dtype is BF16 or F32.
void validate(const SampleSpec& spec);

// Threads per CTA of the generated kernel (one CTA per row).
constexpr int kSampleThreads = 1024;

// Source with entry point "kdtree_sample_tokens".
KernelSource generate_sample_tokens(const SampleSpec& spec, const Arch& arch);

}  // namespace kdtree::codegen
