// sample_tokens on the GPU against the CPU reference (same RNG and formula):
// greedy must match exactly; sampling may differ only on rows whose two
// candidates' perturbed scores agree to 1e-5 (last-ulp differences of log).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/half.hpp"
#include "reference/sample_tokens.hpp"
#include "runtime/tree_ops.hpp"
#include "tests/support/device.hpp"
#include "tests/support/gpu_fixture.hpp"

using kdtree::test::DeviceBuffer;
using kdtree::test::Gpu;

namespace {

const char* const kTempDir = "kdtree-sample-gpu";

// Runs the kernel on `in` (logits stored as `dtype`; bf16 inputs must already be
// bf16 values so that the reference sees the same numbers).
std::vector<int32_t> run(kdtree::Engine& rt, const kdtree::ref::SampleInput& in, kdtree_dtype dtype) {
  DeviceBuffer logits;
  if (dtype == KDTREE_DTYPE_BF16) {
    std::vector<uint16_t> h(in.logits.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = kdtree::ref::float_to_bf16(in.logits[i]);
    logits = DeviceBuffer(h);
  } else {
    logits = DeviceBuffer(in.logits);
  }
  DeviceBuffer offsets;
  if (!in.row_offsets.empty()) offsets = DeviceBuffer(in.row_offsets);
  DeviceBuffer out(sizeof(int32_t) * static_cast<size_t>(in.num_rows));
  kdtree_sample_args a{};
  a.num_rows = in.num_rows;
  a.vocab_size = in.vocab_size;
  a.logits_dtype = dtype;
  a.logits = logits.get();
  a.row_stride = in.row_stride;
  a.temperature = in.temperature;
  a.seed = in.seed;
  a.row_offsets = in.row_offsets.empty() ? nullptr : offsets.get<const int64_t>();
  a.out_tokens = out.get<int32_t>();
  kdtree::sample_tokens(rt, a);
  return out.download<int32_t>();
}

// Checks GPU tokens against the reference; returns the number of tolerated mismatches.
int compare(const kdtree::ref::SampleInput& in, const std::vector<int32_t>& gpu) {
  const std::vector<int32_t> cpu = kdtree::ref::sample_tokens(in);
  REQUIRE(gpu.size() == cpu.size());
  const int64_t stride = in.row_stride == 0 ? in.vocab_size : in.row_stride;
  const bool greedy = kdtree::ref::sample_is_greedy(in.temperature);
  int mismatches = 0;
  for (int r = 0; r < in.num_rows; ++r) {
    INFO("row ", r, ": gpu ", gpu[r], " cpu ", cpu[r]);
    REQUIRE(gpu[r] >= 0);
    REQUIRE(gpu[r] < in.vocab_size);
    if (gpu[r] == cpu[r]) continue;
    REQUIRE(!greedy);
    ++mismatches;
    const float* row = in.logits.data() + r * stride;
    const uint64_t key = kdtree::ref::sample_row_key(in.seed, kdtree::ref::sample_row_offset(in, r));
    const float s_gpu = kdtree::ref::sample_score(row[gpu[r]], in.temperature, key, gpu[r]);
    const float s_cpu = kdtree::ref::sample_score(row[cpu[r]], in.temperature, key, cpu[r]);
    CHECK(std::fabs(s_gpu - s_cpu) <= 1e-5f * std::max(1.0f, std::fabs(s_cpu)));
  }
  CHECK(mismatches <= 1 + in.num_rows / 1000);
  return mismatches;
}

float bf16_round(float x) { return kdtree::ref::bf16_to_float(kdtree::ref::float_to_bf16(x)); }

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("sample_tokens GPU: greedy ties go to the lowest index - NaN counts as -inf") {
  Gpu gpu(kTempDir);
  for (kdtree_dtype dtype : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
    // Rows with the maximum at several places, across threads, warps and loop rounds.
    kdtree::ref::SampleInput in;
    in.vocab_size = 70001;
    in.row_stride = 70003;  // odd: rows start misaligned, exercising head and tail elements
    std::vector<std::vector<std::pair<int, float>>> rows = {
        {{5, 3.0f}, {30000, 3.0f}},         // tie far apart -> 5
        {{69999, 2.0f}, {70000, 2.0f}},     // tie in the tail -> 69999
        {{0, kNaN}, {1, 1.0f}, {2, kNaN}},  // NaN is never the max
        {{70000, 9.0f}},                    // last element
        {{0, 9.0f}, {1, 9.0f}},             // first element
        {{1234, kInf}, {777, kInf}},        // infinities tie -> 777
        {{8, 1.0f}, {16, 1.0f}, {24, 1.0f}},
    };
    in.num_rows = static_cast<int>(rows.size()) + 2;
    in.logits.assign(static_cast<size_t>(in.num_rows) * in.row_stride, -1.0f);
    for (size_t r = 0; r < rows.size(); ++r) {
      in.logits[r * in.row_stride + in.vocab_size] = 100.0f;  // padding: never a token
      for (auto [t, v] : rows[r]) in.logits[r * in.row_stride + t] = v;
    }
    // All -inf, and all NaN: token 0.
    std::fill_n(in.logits.begin() + rows.size() * in.row_stride, in.vocab_size, -kInf);
    std::fill_n(in.logits.begin() + (rows.size() + 1) * in.row_stride, in.vocab_size, kNaN);
    INFO("sample_tokens[", dtype == KDTREE_DTYPE_BF16 ? "bf16" : "f32", ",greedy,vocab=70001,stride=70003]");
    const std::vector<int32_t> got = run(gpu.rt, in, dtype);
    CHECK(got == std::vector<int32_t>{5, 69999, 1, 70000, 0, 777, 8, 0, 0});
    compare(in, got);
  }
}

TEST_CASE("sample_tokens GPU: random logits match the reference") {
  Gpu gpu(kTempDir);
  std::mt19937_64 rng(0x5eed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  struct Shape {
    int rows, vocab, pad;
  };
  const Shape shapes[] = {{1, 1, 0}, {3, 7, 1}, {64, 1000, 0}, {33, 32000, 3}, {5, 129280, 0}, {2, 256000, 1}};
  for (kdtree_dtype dtype : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
    for (const Shape& shape : shapes) {
      for (float T : {0.0f, -1.0f, 0.8f, 1.5f}) {
        for (bool offsets : {false, true}) {
          kdtree::ref::SampleInput in;
          in.num_rows = shape.rows;
          in.vocab_size = shape.vocab;
          in.row_stride = shape.pad ? shape.vocab + shape.pad : 0;
          in.temperature = T;
          in.seed = rng();
          const size_t stride = static_cast<size_t>(shape.vocab + shape.pad);
          in.logits.resize(stride * shape.rows);
          // bf16-representable values, coarse enough that greedy ties happen.
          for (float& x : in.logits) x = bf16_round(normal(rng));
          if (offsets) {
            for (int r = 0; r < shape.rows; ++r) {
              in.row_offsets.push_back(static_cast<int64_t>(rng() >> 1) - (1ll << 61));
            }
          }
          INFO("sample_tokens[", dtype == KDTREE_DTYPE_BF16 ? "bf16" : "f32", ",rows=", shape.rows,
               ",vocab=", shape.vocab, ",stride=", stride, ",T=", T, ",offsets=", offsets, "]");
          compare(in, run(gpu.rt, in, dtype));
        }
      }
    }
  }
}

TEST_CASE("sample_tokens GPU: frequencies match softmax - seeds reproduce") {
  Gpu gpu(kTempDir);
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f};  // exact in bf16
  const float T = 0.7f;
  const int rows = 20000;
  std::vector<double> p(6);
  double z = 0.0;
  for (int i = 0; i < 6; ++i) z += p[i] = std::exp(double(logits[i]) / T);
  for (double& x : p) x /= z;
  for (kdtree_dtype dtype : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
    INFO("sample_tokens[", dtype == KDTREE_DTYPE_BF16 ? "bf16" : "f32", ",vocab=6,T=0.7,rows=20000]");
    kdtree::ref::SampleInput in;
    in.num_rows = rows;
    in.vocab_size = 6;
    in.temperature = T;
    in.seed = 20240601;
    for (int r = 0; r < rows; ++r) in.logits.insert(in.logits.end(), logits.begin(), logits.end());
    const std::vector<int32_t> a = run(gpu.rt, in, dtype);
    compare(in, a);
    std::vector<double> count(6, 0.0);
    for (int32_t t : a) count[static_cast<size_t>(t)] += 1.0;
    double chi2 = 0.0;
    for (int i = 0; i < 6; ++i) chi2 += (count[i] - rows * p[i]) * (count[i] - rows * p[i]) / (rows * p[i]);
    INFO("chi-square = ", chi2);
    CHECK(chi2 < 25.74);  // upper 1e-4 quantile, 5 degrees of freedom

    CHECK(run(gpu.rt, in, dtype) == a);  // same seed, same tokens
    in.seed = 20240602;
    const std::vector<int32_t> b = run(gpu.rt, in, dtype);
    int same = 0;
    for (int r = 0; r < rows; ++r) same += a[r] == b[r];
    CHECK(same < rows * 0.55);  // independent draws agree with probability sum p_i^2 = 0.51
    // Rows with one offset draw the same token.
    in.row_offsets.assign(rows, 99);
    const std::vector<int32_t> c = run(gpu.rt, in, dtype);
    CHECK(std::all_of(c.begin(), c.end(), [&](int32_t t) { return t == c[0]; }));
  }
}
