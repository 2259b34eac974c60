// kdtree_sample_tokens: host validation (before any device use) and the launch:
// one CTA per logits row.
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "codegen/dtype_check.hpp"
#include "codegen/sample_tokens.hpp"
#include "runtime/arg_checks.hpp"
#include "runtime/tree_ops.hpp"
#include "sample_tokens_params.h"

namespace kdtree {

void sample_tokens(Engine& rt, const kdtree_sample_args& a) {
  codegen::SampleSpec spec;
  spec.logits_dtype = codegen::checked_dtype(a.logits_dtype, "logits_dtype");
  codegen::validate(spec);
  require(a.num_rows >= 1, "num_rows = {} must be >= 1", a.num_rows);
  require(a.vocab_size >= 1, "vocab_size = {} must be >= 1", a.vocab_size);
  const int64_t row_stride = a.row_stride == 0 ? a.vocab_size : a.row_stride;
  require(row_stride >= a.vocab_size, "row_stride = {} must be 0 or >= vocab_size = {}", a.row_stride, a.vocab_size);
  require_buffer(a.logits, spec.logits_dtype == KDTREE_DTYPE_F32 ? 4 : 2, "logits");
  require_buffer(a.out_tokens, 4, "out_tokens");
  require_optional_buffer(a.row_offsets, 8, "row_offsets");
  // -inf is a temperature <= 0 (greedy); NaN and +inf say nothing a caller could mean.
  require(!std::isnan(a.temperature) && a.temperature != INFINITY, "temperature = {} must be finite, or <= 0 (greedy)",
          a.temperature);

  // T <= 0 is greedy; so is a T so small that 1/T overflows (its limit is the argmax).
  const float inv_temperature = a.temperature > 0.0f ? 1.0f / a.temperature : 0.0f;
  const bool greedy = !(a.temperature > 0.0f) || !std::isfinite(inv_temperature);

  Module& module = rt.module(spec.fast_key(), [&] { return codegen::generate_sample_tokens(spec, rt.arch()); });
  CUfunction fn = module.function("kdtree_sample_tokens", 0);

  kdtree_sample_tokens_params p{};
  p.logits = a.logits;
  p.row_offsets = reinterpret_cast<const long long*>(a.row_offsets);
  p.out_tokens = a.out_tokens;
  p.row_stride = row_stride;
  p.seed = a.seed;
  p.num_rows = a.num_rows;
  p.vocab_size = a.vocab_size;
  p.inv_temperature = greedy ? 0.0f : inv_temperature;
  p.greedy = greedy ? 1 : 0;
  void* args[] = {&p};

  LaunchDims dims;
  dims.grid_x = static_cast<unsigned>(a.num_rows);
  dims.block_x = static_cast<unsigned>(module.launch().threads);
  rt.launch(fn, dims, args, static_cast<CUstream>(a.stream), "sample_tokens");
}

}  // namespace kdtree
