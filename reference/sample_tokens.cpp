#include "reference/sample_tokens.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace kdtree::ref {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

float inverse_temperature(float temperature) { return temperature > 0.0f ? 1.0f / temperature : 0.0f; }

}  // namespace

uint64_t sample_row_key(uint64_t seed, int64_t offset) { return mix64(mix64(seed) + static_cast<uint64_t>(offset)); }

float sample_uniform(uint64_t row_key, int32_t token) {
  const uint32_t k0 = static_cast<uint32_t>(row_key), k1 = static_cast<uint32_t>(row_key >> 32);
  const uint32_t h = fmix32(fmix32(static_cast<uint32_t>(token) ^ k0) ^ k1);
  // (2m + 1) / 2^25 rounded to float (as the GPU's cvt.rn), clamped below 1.
  const float u = static_cast<float>(2u * (h >> 8) + 1u) * 2.98023223876953125e-8f;
  return std::fmin(u, 0.99999994039535522f);
}

float sample_gumbel(uint64_t row_key, int32_t token) { return -std::log(-std::log(sample_uniform(row_key, token))); }

bool sample_is_greedy(float temperature) {
  return !(temperature > 0.0f) || !std::isfinite(inverse_temperature(temperature));
}

float sample_score(float logit, float temperature, uint64_t row_key, int32_t token) {
  const float v = std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
  return std::fma(v, inverse_temperature(temperature), sample_gumbel(row_key, token));
}

int64_t sample_row_offset(const SampleInput& in, int row) {
  return in.row_offsets.empty() ? row : in.row_offsets[static_cast<size_t>(row)];
}

std::vector<int32_t> sample_tokens(const SampleInput& in) {
  const int64_t stride = in.row_stride == 0 ? in.vocab_size : in.row_stride;
  if (in.num_rows < 0 || in.vocab_size < 1 || stride < in.vocab_size) {
    throw std::invalid_argument("sample_tokens reference: bad num_rows / vocab_size / row_stride");
  }
  if (in.logits.size() < static_cast<size_t>(stride) * static_cast<size_t>(in.num_rows) ||
      (!in.row_offsets.empty() && in.row_offsets.size() != static_cast<size_t>(in.num_rows))) {
    throw std::invalid_argument("sample_tokens reference: logits / row_offsets have the wrong size");
  }
  const bool greedy = sample_is_greedy(in.temperature);
  std::vector<int32_t> out(static_cast<size_t>(in.num_rows));
  for (int r = 0; r < in.num_rows; ++r) {
    const float* row = in.logits.data() + static_cast<size_t>(r) * static_cast<size_t>(stride);
    const uint64_t key = sample_row_key(in.seed, sample_row_offset(in, r));
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_index = 0;
    for (int t = 0; t < in.vocab_size; ++t) {
      float s;
      if (greedy) {
        s = std::isnan(row[t]) ? -std::numeric_limits<float>::infinity() : row[t];
      } else {
        s = sample_score(row[t], in.temperature, key, t);
      }
      if (s > best) {  // strict: the lowest index keeps a tie
        best = s;
        best_index = t;
      }
    }
    out[static_cast<size_t>(r)] = best_index;
  }
  return out;
}

}  // namespace kdtree::ref
