// CPU reference of sample_tokens, with the kernel's counter-based RNG and float
// formula: greedy argmax (lowest index wins ties), or the Gumbel-max trick
// token = argmax(fma(logit, 1/T, g)), g = -log(-log(u)), u = hash(seed, row offset, token).
// NaN logits count as -inf. The GPU's log differs from the host's in the last ulp
// at most, so the two agree on all but (rare) rows whose top scores nearly tie.
#pragma once
#include <cstdint>
#include <vector>

namespace kdtree::ref {

// Key of one row's random stream: mix64(mix64(seed) + offset).
uint64_t sample_row_key(uint64_t seed, int64_t offset);

// Uniform in (0, 1) (never 0 or 1; 24 random bits) for token `token` of a row.
float sample_uniform(uint64_t row_key, int32_t token);

// Gumbel noise -log(-log(u)) of token `token` of a row.
float sample_gumbel(uint64_t row_key, int32_t token);

// The kernel's decision: greedy when T <= 0 or 1/T overflows.
bool sample_is_greedy(float temperature);

// Perturbed score of a token, fma(logit, 1/T, g), NaN logits as -inf.
float sample_score(float logit, float temperature, uint64_t row_key, int32_t token);

struct SampleInput {
  int num_rows = 0;
  int vocab_size = 0;
  int64_t row_stride = 0;    // elements; 0 = vocab_size
  float temperature = 0.0f;  // <= 0: greedy
  uint64_t seed = 0;
  std::vector<float> logits;         // [num_rows, row_stride] (bf16 inputs widened exactly)
  std::vector<int64_t> row_offsets;  // [num_rows], or empty = row index
};

// One token per row. Throws std::invalid_argument on inconsistent sizes.
std::vector<int32_t> sample_tokens(const SampleInput& in);

// The RNG offset of row r (row_offsets[r] or r).
int64_t sample_row_offset(const SampleInput& in, int row);

}  // namespace kdtree::ref
