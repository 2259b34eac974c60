// The sample_tokens CPU reference: greedy ties and NaNs, the RNG's range and
// reproducibility, and Gumbel-max frequencies against softmax (chi-square).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "reference/sample_tokens.hpp"

using kdtree::ref::SampleInput;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

SampleInput one_row(std::vector<float> logits, float temperature = 0.0f) {
  SampleInput in;
  in.num_rows = 1;
  in.vocab_size = static_cast<int>(logits.size());
  in.temperature = temperature;
  in.logits = std::move(logits);
  return in;
}

// Upper 1e-4 quantile of chi-square with 5 degrees of freedom.
constexpr double kChiSquare5dof_p1e4 = 25.74;

}  // namespace

TEST_CASE("sample_tokens reference: greedy argmax - lowest index wins ties") {
  CHECK(kdtree::ref::sample_tokens(one_row({1, 3, 2, 3, 0}))[0] == 1);
  CHECK(kdtree::ref::sample_tokens(one_row({5}))[0] == 0);
  CHECK(kdtree::ref::sample_tokens(one_row({-1, -1, -1}))[0] == 0);
  CHECK(kdtree::ref::sample_tokens(one_row({0, kInf, 1, kInf}))[0] == 1);
  // NaN counts as -inf: never chosen over a number, and ties with -inf.
  CHECK(kdtree::ref::sample_tokens(one_row({kNaN, -5, kNaN}))[0] == 1);
  CHECK(kdtree::ref::sample_tokens(one_row({kNaN, -kInf}))[0] == 0);
  CHECK(kdtree::ref::sample_tokens(one_row({-kInf, kNaN}))[0] == 0);
  CHECK(kdtree::ref::sample_tokens(one_row({kNaN, kNaN}))[0] == 0);
  // T <= 0 is greedy; so is a T whose inverse overflows.
  CHECK(kdtree::ref::sample_is_greedy(0.0f));
  CHECK(kdtree::ref::sample_is_greedy(-1.0f));
  CHECK(kdtree::ref::sample_is_greedy(1e-39f));
  CHECK(!kdtree::ref::sample_is_greedy(0.7f));
  CHECK(kdtree::ref::sample_tokens(one_row({1, 3, 2, 3, 0}, 1e-39f))[0] == 1);
}

TEST_CASE("sample_tokens reference: row_stride padding is never read as a token") {
  SampleInput in;
  in.num_rows = 3;
  in.vocab_size = 4;
  in.row_stride = 6;
  in.logits = {0, 1, 2, 0, 99, 99,  //
               7, 1, 2, 0, 99, 99,  //
               0, 1, 2, 3, 99, 99};
  CHECK(kdtree::ref::sample_tokens(in) == std::vector<int32_t>{2, 0, 3});
  in.temperature = 0.5f;
  for (int32_t t : kdtree::ref::sample_tokens(in)) CHECK(t < 4);
}

TEST_CASE("sample_tokens reference: uniforms lie in (0 - 1) and Gumbel noise has mean 0.5772") {
  double sum_u = 0.0, sum_g = 0.0;
  const int n = 200000;
  for (int t = 0; t < n; ++t) {
    const uint64_t key = kdtree::ref::sample_row_key(1234, t / 1000);
    const float u = kdtree::ref::sample_uniform(key, t % 1000);
    REQUIRE(u > 0.0f);
    REQUIRE(u < 1.0f);
    const float g = kdtree::ref::sample_gumbel(key, t % 1000);
    REQUIRE(std::isfinite(g));
    REQUIRE(g < 17.0f);  // the kernel's pruning bound
    sum_u += u;
    sum_g += g;
  }
  // Standard errors: 0.29 / sqrt(n) = 6.5e-4 and 1.28 / sqrt(n) = 2.9e-3.
  CHECK(sum_u / n == doctest::Approx(0.5).epsilon(0.004));
  CHECK(sum_g / n == doctest::Approx(0.5772156649).epsilon(0.03));
  // Extreme draws of the clamp are still finite.
  CHECK(std::isfinite(-std::log(-std::log(0.99999994039535522f))));
}

TEST_CASE("sample_tokens reference: same seed same tokens - another seed other tokens") {
  SampleInput in;
  in.num_rows = 256;
  in.vocab_size = 1000;
  in.temperature = 1.0f;
  in.logits.assign(static_cast<size_t>(in.num_rows) * in.vocab_size, 0.0f);  // uniform over 1000 tokens
  in.seed = 42;
  const std::vector<int32_t> a = kdtree::ref::sample_tokens(in);
  CHECK(kdtree::ref::sample_tokens(in) == a);
  in.seed = 43;
  const std::vector<int32_t> b = kdtree::ref::sample_tokens(in);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  CHECK(same < 8);  // ~0.26 expected by chance
  // Rows draw from their offsets: equal offsets give equal tokens, and the
  // default offset is the row index.
  in.row_offsets.assign(static_cast<size_t>(in.num_rows), 7);
  const std::vector<int32_t> c = kdtree::ref::sample_tokens(in);
  for (int32_t t : c) CHECK(t == c[0]);
  for (int r = 0; r < in.num_rows; ++r) in.row_offsets[static_cast<size_t>(r)] = r;
  CHECK(kdtree::ref::sample_tokens(in) == b);
}

TEST_CASE("sample_tokens reference: Gumbel-max frequencies match softmax(logits / T)") {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f};
  const float T = 0.7f;
  const int rows = 20000;
  SampleInput in;
  in.num_rows = rows;
  in.vocab_size = 6;
  in.temperature = T;
  in.seed = 20240601;
  for (int r = 0; r < rows; ++r) in.logits.insert(in.logits.end(), logits.begin(), logits.end());
  const std::vector<int32_t> tokens = kdtree::ref::sample_tokens(in);

  std::vector<double> p(6), count(6, 0.0);
  double z = 0.0;
  for (int i = 0; i < 6; ++i) z += p[i] = std::exp(double(logits[i]) / T);
  for (double& x : p) x /= z;
  for (int32_t t : tokens) {
    REQUIRE(t >= 0);
    REQUIRE(t < 6);
    count[t] += 1.0;
  }
  double chi2 = 0.0;
  for (int i = 0; i < 6; ++i) chi2 += (count[i] - rows * p[i]) * (count[i] - rows * p[i]) / (rows * p[i]);
  INFO("sample_tokens[vocab=6,T=0.7,rows=20000] chi-square = ", chi2);
  CHECK(chi2 < kChiSquare5dof_p1e4);
}
