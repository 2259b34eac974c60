// verify_attention on the GPU against the float64 reference, across the grid:
// MLA 576/512 and GQA 64/128/256 x W 16..128 x page 1/16/64 x bf16/f16, and
// the same W and pages with e4m3 caches (random scales; against the float64
// reference over the dequantised cache), with random trees, uneven and long
// prefixes, scattered pages, NaN in every cache row no request owns, lse on and
// off, and 1, 3 or automatic KV splits.
// Everything goes through the C ABI, as a host program would use it.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codegen/arch.hpp"
#include "codegen/verify_attention.hpp"
#include "kdtree/kdtree.h"
#include "reference/verify_attention.hpp"
#include "reference/verify_case.hpp"
#include "tests/support/device.hpp"
#include "tests/support/env_var.hpp"
#include "tests/support/gpu_case_filter.hpp"

namespace {

using kdtree::ref::make_verify_spec;
using kdtree::ref::verify_label;

using kdtree::ref::VerifyCase;
using kdtree::ref::VerifyCaseOptions;
using kdtree::test::DeviceBuffer;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Fresh data every run; KDTREE_TEST_SEED reproduces a run (the seed is in every label).
uint64_t base_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("KDTREE_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::random_device{}()) % 1000000;
  }();
  return seed;
}

// One runtime (and one cubin cache directory) for the whole binary: each kernel
// config compiles once.
struct Session {
  std::string dir;
  kdtree_runtime* rt = nullptr;
  // The e4m3 MMA path's session (tiles mma=e4m3): e4m3 points only, its own tolerance.
  bool e4m3_mma = false;
  // A family without e4m3 caches (wgmma): the grid's 16-bit points only.
  bool kv16_only = false;
  Session() {
    char tmpl[] = "/tmp/kdtree-verify-gpu-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir = tmpl;
    if (kdtree_runtime_create(0, dir.c_str(), &rt) != KDTREE_OK)
      throw std::runtime_error(std::string("kdtree_runtime_create: ") + kdtree_last_error());
  }
  ~Session() {
    kdtree_runtime_destroy(rt);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  static Session& get() {
    static Session session;
    return session;
  }
  // Binds the device's primary context to the calling thread (before any allocation).
  void bind() { REQUIRE_MESSAGE(kdtree_runtime_bind_context(rt) == KDTREE_OK, kdtree_last_error()); }
};

// The six paths the tally keeps apart: q dtype x (16-bit cache, e4m3 cache
// dequantised, e4m3 cache on the e4m3 MMA path).
int path_index(const kdtree_verify_spec& s, bool e4m3_mma) {
  return (s.dtype == KDTREE_DTYPE_BF16 ? 0 : 1) + (s.kv_dtype == KDTREE_KV_DTYPE_E4M3 ? (e4m3_mma ? 4 : 2) : 0);
}
constexpr int kPaths = 6;
constexpr const char* kPathNames[kPaths] = {
    "bf16", "f16", "bf16,kv=e4m3", "f16,kv=e4m3", "bf16,kv=e4m3,mma=e4m3", "f16,kv=e4m3,mma=e4m3"};

// The worst result over every launch, printed once at exit.
struct Tally {
  int launches = 0, failed = 0;
  double worst_rel = -1, worst_lse = -1;
  std::string worst_label, worst_lse_label;
  double worst_rel_by_dtype[kPaths] = {};  // path_index
  double worst_lse_by_dtype[kPaths] = {};
  int launches_by_dtype[kPaths] = {};
  void record(const std::string& label, int dtype, const kdtree::ref::VerifyComparison& cmp, bool ok) {
    ++launches;
    failed += !ok;
    if (cmp.worst_rel > worst_rel) {
      worst_rel = cmp.worst_rel;
      worst_label = label;
    }
    if (cmp.max_lse_abs > worst_lse) {
      worst_lse = cmp.max_lse_abs;
      worst_lse_label = label;
    }
    worst_rel_by_dtype[dtype] = std::max(worst_rel_by_dtype[dtype], cmp.worst_rel);
    worst_lse_by_dtype[dtype] = std::max(worst_lse_by_dtype[dtype], cmp.max_lse_abs);
    ++launches_by_dtype[dtype];
  }
  ~Tally() {
    if (launches == 0) return;
    std::printf(
        "verify_attention GPU parity: %d cases, worst rel err %.3e at %s (bf16 %.3e, f16 %.3e), "
        "worst lse abs err %.3e at %s, %d failed, seed %llu\n",
        launches, worst_rel, worst_label.c_str(), worst_rel_by_dtype[0], worst_rel_by_dtype[1], worst_lse,
        worst_lse_label.c_str(), failed, (unsigned long long)base_seed());
    for (int i = 0; i < kPaths; ++i) {
      if (launches_by_dtype[i] == 0) continue;
      std::printf("verify_attention GPU parity [%s]: %d launches, worst rel err %.3e, worst lse abs err %.3e\n",
                  kPathNames[i], launches_by_dtype[i], worst_rel_by_dtype[i], worst_lse_by_dtype[i]);
    }
  }
};
Tally& tally() {
  static Tally t;
  return t;
}

// e4m3 caches: the same rule against the reference over the dequantised cache
// (KV is exact after dequantisation; Q and P stay 16-bit). The e4m3 MMA path
// quantises Q (per row) and P to e4m3, 3 mantissa bits: its bound is kdtree.h's.
constexpr double kE4m3MmaRelTolerance = 0.1;
constexpr double kE4m3Rounding = 1.0 / 16;  // e4m3's relative rounding error (3 mantissa bits)
double rel_tolerance(kdtree_dtype dtype, bool e4m3_mma = false) {
  if (e4m3_mma) return kE4m3MmaRelTolerance;
  return dtype == KDTREE_DTYPE_BF16 ? 1e-2 : 2e-3;
}
constexpr double kLseTolerance = 1e-2;

// A case's arrays on the device. The workspace is sized for forced splits too.
struct DeviceCase {
  DeviceBuffer q, k, v, table, kv_lens, indptr, mask, out, lse, workspace, flags;
  size_t queried_workspace = 0;  // kdtree_verify_workspace_size (automatic splits)
};

size_t forced_split_workspace(const VerifyCase& c, int splits) {
  // kdtree.h's size for forced splits: per split and (node, head), a 16-bit partial
  // output row and an fp32 LSE. Only used to size the buffer for forced splits, since
  // kdtree_verify_workspace_size plans the automatic split.
  return size_t(splits) * c.total_nodes * c.spec.num_q_heads * (c.spec.head_dim_v * 2 + sizeof(float));
}

// The arrays alone, without asking kdtree_verify_workspace_size (which needs the
// kernel): for calls that must fail before any kernel is generated.
DeviceCase upload_unplanned(const VerifyCase& c) {
  DeviceCase d;
  d.q = DeviceBuffer(c.q);
  if (c.kv_fp8()) {
    d.k = DeviceBuffer(c.k_cache8);
    if (!c.mla) d.v = DeviceBuffer(c.v_cache8);
  } else {
    d.k = DeviceBuffer(c.k_cache);
    if (!c.mla) d.v = DeviceBuffer(c.v_cache);
  }
  d.table = DeviceBuffer(c.page_table);
  d.kv_lens = DeviceBuffer(c.kv_lens);
  d.indptr = DeviceBuffer(c.node_indptr);
  d.mask = DeviceBuffer(c.tree_mask);
  d.out = DeviceBuffer(c.out_elems() * sizeof(uint16_t));
  d.lse = DeviceBuffer(c.lse_elems() * sizeof(float));
  d.flags = DeviceBuffer(sizeof(int32_t));
  d.workspace = DeviceBuffer(forced_split_workspace(c, 3));
  return d;
}

DeviceCase upload(kdtree_runtime* rt, const VerifyCase& c, int max_forced_splits) {
  DeviceCase d = upload_unplanned(c);
  const kdtree_status st =
      kdtree_verify_workspace_size(rt, &c.spec, c.batch_size, c.total_nodes, c.max_kv_len, &d.queried_workspace);
  REQUIRE_MESSAGE(st == KDTREE_OK, kdtree_last_error());
  d.workspace = DeviceBuffer(std::max(d.queried_workspace, forced_split_workspace(c, max_forced_splits)));
  return d;
}

kdtree_verify_args make_args(const VerifyCase& c, DeviceCase& d, bool with_lse, int splits) {
  kdtree_verify_args a{};
  a.spec = c.spec;
  a.batch_size = c.batch_size;
  a.total_nodes = c.total_nodes;
  a.max_kv_len = c.max_kv_len;
  a.num_pages = c.num_pages;
  a.q = d.q.get();
  a.node_indptr = d.indptr.get<const int32_t>();
  a.k_cache = d.k.get();
  a.v_cache = c.mla ? nullptr : d.v.get();
  a.page_table = d.table.get<const int32_t>();
  a.max_pages_per_req = c.max_pages_per_req;
  a.kv_lens = d.kv_lens.get<const int32_t>();
  a.tree_mask = d.mask.get<const uint64_t>();
  a.sm_scale = c.sm_scale;
  a.out = d.out.get();
  a.lse = with_lse ? d.lse.get<float>() : nullptr;
  a.workspace = d.workspace.get();
  // Automatic splits get exactly what kdtree_verify_workspace_size asked for.
  a.workspace_size = splits == 0 ? d.queried_workspace : d.workspace.bytes();
  a.error_flags = d.flags.get<int32_t>();
  a.stream = nullptr;
  a.num_splits = splits;
  if (c.kv_fp8()) {
    a.k_scale = c.k_scale;
    a.v_scale = c.v_scale;
  }
  return a;
}

struct Launch {
  kdtree_status status = KDTREE_OK;
  std::string error;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  int32_t flags = 0;
};

// poison: the byte written over out and lse first (0xFF = NaN catches unwritten
// elements; 0x00 makes "written as NaN" checkable).
Launch launch(kdtree_runtime* rt, const VerifyCase& c, DeviceCase& d, bool with_lse, int splits,
              unsigned char poison = 0xFF) {
  d.out.poison(poison);
  d.lse.poison(poison);
  d.flags.poison(0);
  const kdtree_verify_args a = make_args(c, d, with_lse, splits);
  Launch r;
  r.status = kdtree_verify_attention(rt, &a);
  r.error = kdtree_last_error();
  r.out = d.out.download<uint16_t>();  // synchronises
  if (with_lse) r.lse = d.lse.download<float>();
  r.flags = d.flags.download<int32_t>()[0];
  return r;
}

// Launches one case with the given split count and checks it against `ref`.
void check_launch(kdtree_runtime* rt, const VerifyCase& c, const kdtree::ref::VerifyReference& ref, DeviceCase& d,
                  int splits, bool with_lse, bool e4m3_mma = false) {
  const std::string label =
      c.label("splits=" + std::to_string(splits) + (with_lse ? "" : ",lse=NULL") + ",seed=" + std::to_string(c.seed));
  INFO(label);
  const Launch r = launch(rt, c, d, with_lse, splits);
  INFO("kdtree_last_error: " << r.error);
  CHECK(r.status == KDTREE_OK);
  if (r.status != KDTREE_OK) {
    tally().record(label, path_index(c.spec, e4m3_mma), {}, false);
    return;
  }
  const auto cmp = kdtree::ref::compare_verify(c, ref, r.out, with_lse ? r.lse.data() : nullptr);
  INFO(cmp.summary());
  const double tol = rel_tolerance(c.spec.dtype, e4m3_mma);
  bool ok = cmp.nan_out == 0 && cmp.nan_lse == 0 && r.flags == 0;
  CHECK(cmp.nan_out == 0);  // every element written, nothing leaked from NaN rows
  CHECK(cmp.nan_lse == 0);
  CHECK(r.flags == 0);
  for (int b = 0; b < c.batch_size; ++b) {
    INFO("request " << b << ": prefix " << c.prefix_lens[b] << ", nodes " << c.node_counts[b]);
    CHECK(cmp.rel_err[b] < tol);
    ok &= cmp.rel_err[b] < tol;
  }
  if (with_lse && !e4m3_mma) {
    CHECK(cmp.max_lse_abs < kLseTolerance);
    ok &= cmp.max_lse_abs < kLseTolerance;
  }
  if (with_lse && e4m3_mma) {
    // Quantising q per row (relative error <= 2^-4) moves each score by at most
    // 2^-4 x sum |q_i k_i| x sm_scale x k_scale, and the LSE by at most the largest
    // such move; kLseTolerance covers the rest, as on the 16-bit paths.
    REQUIRE(ref.score_abs_bound.size() == ref.lse.size());
    int over = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < ref.lse.size(); ++i) {
      const double bound = kE4m3Rounding * ref.score_abs_bound[i] + kLseTolerance;
      const double err = std::fabs(double(r.lse[i]) - ref.lse[i]);
      over += !(err <= bound);
      worst_ratio = std::max(worst_ratio, err / bound);
    }
    INFO("lse error / its bound, worst: " << worst_ratio);
    CHECK(over == 0);
    ok &= over == 0;
  }
  tally().record(label, path_index(c.spec, e4m3_mma), cmp, ok);
}

// The compute capability of the session's GPU (sm_XX as XX).
int session_sm(const Session& s) {
  int sm = 0;
  REQUIRE(kdtree_runtime_arch(s.rt, &sm) == KDTREE_OK);
  return sm;
}

// Whether the kernel the runtime compiles for `spec` (the generator's tiles for this
// GPU, KDTREE_VERIFY_TILES included) is on the e4m3 MMA path, whose tolerance is
// Q's and P's rounding: sm_120's e4m3 kernels and sm_90's MLA e4m3 (wgmma) kernel.
bool takes_e4m3_mma(const Session& s, const kdtree_verify_spec& spec) {
  if (s.e4m3_mma) return true;
  if (spec.kv_dtype != KDTREE_KV_DTYPE_E4M3) return false;
  namespace cg = kdtree::codegen;
  return cg::verify_tiles(cg::validate_verify_spec(spec), cg::arch_from_sm(session_sm(s))).mma_e4m3;
}

// Compiles every spec in parallel (NVRTC takes seconds per config).
void warm(Session& s, const std::vector<kdtree_verify_spec>& specs) {
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(specs.size());
  auto worker = [&] {
    kdtree_runtime_bind_context(s.rt);
    for (size_t i = next++; i < specs.size(); i = next++)
      if (kdtree_warm(s.rt, &specs[i]) != KDTREE_OK) errors[i] = kdtree_last_error();
  };
  const unsigned n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 16));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO("kdtree_warm[" << specs[i].head_dim_qk << "/" << specs[i].head_dim_v << ",W=" << specs[i].max_tree_nodes
                        << ",page=" << specs[i].page_size << ",dtype=" << int(specs[i].dtype)
                        << ",kv_dtype=" << int(specs[i].kv_dtype) << "]: " << errors[i]);
    CHECK(errors[i].empty());
  }
}

// Reference work of a case in flops, to keep the CPU side of the suite short.
double reference_flops(const kdtree_verify_spec& s, int batch, int max_prefix) {
  const double nodes = s.max_tree_nodes + (batch - 1) * (s.max_tree_nodes + 1) / 2.0;  // request 0 is full
  return nodes * s.num_q_heads * (max_prefix + s.max_tree_nodes) * 2.0 * (s.head_dim_qk + s.head_dim_v);
}

// The grid for one head type: every (W, page, dtype) with 16-bit caches and
// every (W, page) with e4m3 caches (q bf16 and f16 alternating, random scales),
// each with its own head counts, batch, prefix range and value distribution,
// chosen to cycle through the variations; each case runs with splits 1, 3 (lse
// on and off) and auto.
void run_head_grid(int dqk, int dv, int head_index, Session& s = Session::get()) {
  const auto t0 = Clock::now();
  s.bind();
  const bool mla = dqk != dv;
  const int widths[] = {16, 32, 64, 128};
  const int pages[] = {1, 16, 64};
  const kdtree_dtype dtypes[] = {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F16};
  // GQA (group, num_kv_heads): groups 1, 2, 4, 8 x 1..4 KV heads.
  std::vector<std::pair<int, int>> gqa_heads;
  for (int g : {1, 2, 4, 8})
    for (int hkv : {1, 2, 3, 4}) gqa_heads.emplace_back(g, hkv);
  const int prefix_ranges[4][2] = {{0, 100}, {50, 700}, {500, 2500}, {2000, 4500}};
  const double flop_budget = 6e9;  // ~0.3 s of reference on 16 cores

  struct Point {
    kdtree_verify_spec spec;
    int batch;
    VerifyCaseOptions options;
  };
  std::vector<Point> points;
  // (q dtype, cache type) per (W, page): both 16-bit paths, and one e4m3 point
  // whose q dtype alternates.
  std::vector<std::pair<kdtree_dtype, kdtree_kv_dtype>> kinds;
  for (kdtree_dtype dtype : dtypes) kinds.emplace_back(dtype, KDTREE_KV_DTYPE_AS_Q);
  // k16 numbers the 16-bit points as before e4m3 existed, so their variations
  // stay put; an e4m3 point takes the variations of a nearby index.
  int k16 = 0, e4m3_count = 0;
  for (int W : widths) {
    for (int page : pages) {
      std::vector<std::pair<kdtree_dtype, kdtree_kv_dtype>> here = kinds;
      here.emplace_back(dtypes[e4m3_count++ % 2], KDTREE_KV_DTYPE_E4M3);
      for (const auto& [dtype, kv_dtype] : here) {
        const bool fp8 = kv_dtype == KDTREE_KV_DTYPE_E4M3;
        if (s.e4m3_mma && !fp8) {  // its points are the e4m3 ones, numbered as in the full grid
          ++k16;
          continue;
        }
        if (s.kv16_only && fp8) continue;
        const int k = fp8 ? k16 + 3 * e4m3_count : k16++;
        Point p;
        p.batch = 1 + k % 5;
        int hq = 0, hkv = 1;
        const int* range = prefix_ranges[(k / 2 + head_index) % 4];
        p.options.min_prefix = range[0];
        p.options.max_prefix = range[1];
        if (mla) {
          hq = k % 2 ? 8 : 16;
          if (W <= 32 && k % 3 == 0) {  // 128 heads: small trees and batches only
            hq = 128;
            p.batch = std::min(p.batch, 2);
            p.options.max_prefix = std::min(p.options.max_prefix, 1200);
            p.options.min_prefix = std::min(p.options.min_prefix, p.options.max_prefix);
          }
        } else {
          const auto gh = gqa_heads[(k + 5 * head_index) % gqa_heads.size()];
          hkv = gh.second;
          hq = gh.first * gh.second;
        }
        p.spec = make_verify_spec(dqk, dv, hq, hkv, page, W, dtype, kv_dtype);
        // Over budget: fewer requests (down to 2), then shorter prefixes, then one request.
        auto over = [&] { return reference_flops(p.spec, p.batch, p.options.max_prefix) > flop_budget; };
        while (over() && p.batch > 2) --p.batch;
        while (over() && p.options.max_prefix > 64) {
          p.options.max_prefix /= 2;
          p.options.min_prefix /= 2;
        }
        while (over() && p.batch > 1) --p.batch;
        p.options.q_scale = k % 3 == 1 ? 4.0f : 1.0f;  // sharper softmax now and then
        if (k % 5 == 2) {                              // scores rising along the sequence: the reference max moves late
          p.options.q_scale = 4.0f;
          p.options.k_ramp = 3.0f;
        }
        p.options.dist = k % 4 == 3 ? kdtree::ref::ValueDist::normal : kdtree::ref::ValueDist::uniform;
        p.options.max_kv_len_slack = k % 2 ? 0 : 37;
        points.push_back(p);
      }
    }
  }

  // `kdtree_gpu_tests --case NAME` runs the points so named alone.
  points.erase(
      std::remove_if(points.begin(), points.end(),
                     [](const Point& p) { return !kdtree::test::case_selected(verify_label(p.spec, p.batch)); }),
      points.end());
  std::vector<kdtree_verify_spec> specs;
  for (const Point& p : points) specs.push_back(p.spec);
  warm(s, specs);
  const double compile_s = seconds_since(t0);

  int i = 0;
  for (const Point& p : points) {
    const VerifyCase c =
        kdtree::ref::build_verify_case(p.spec, p.batch, base_seed() * 1000 + head_index * 100 + i, p.options);
    const auto ref = kdtree::ref::verify_attention(c.host_inputs());
    DeviceCase d = upload(s.rt, c, 3);
    const bool e4m3_mma = takes_e4m3_mma(s, p.spec);
    check_launch(s.rt, c, ref, d, 1, true, e4m3_mma);
    check_launch(s.rt, c, ref, d, 3, true, e4m3_mma);
    check_launch(s.rt, c, ref, d, 3, false, e4m3_mma);
    check_launch(s.rt, c, ref, d, 0, i % 2 == 0, e4m3_mma);
    ++i;
  }
  const char* tiles = std::getenv("KDTREE_VERIFY_TILES");
  std::printf("verify_attention GPU parity [%s%s%s]: %zu configs x 4 launches in %.1f s (compile %.1f s)\n",
              mla ? "mla576/512" : ("gqa" + std::to_string(dqk)).c_str(), tiles && *tiles ? ",tiles=" : "",
              tiles && *tiles ? tiles : "", points.size(), seconds_since(t0), compile_s);
}

// A valid case for the error tests: B = 2, request 0 the longer one.
VerifyCase error_case(const kdtree_verify_spec& spec, uint64_t seed) {
  VerifyCaseOptions o;
  o.prefix_lens = {std::max(500, 2 * spec.page_size + 9), std::max(100, 2 * spec.page_size + 3)};
  o.node_counts = {spec.max_tree_nodes, spec.max_tree_nodes / 2};
  return kdtree::ref::build_verify_case(spec, 2, seed, o);
}

std::vector<kdtree_verify_spec> error_specs() {
  return {make_verify_spec(576, 512, 16, 1, 64, 64, KDTREE_DTYPE_BF16),
          make_verify_spec(128, 128, 8, 2, 16, 32, KDTREE_DTYPE_F16),
          make_verify_spec(64, 64, 4, 4, 1, 16, KDTREE_DTYPE_BF16)};
}

// Checks request `good` against the reference rows of `ref` (same layout as c).
void check_request(const VerifyCase& c, const kdtree::ref::VerifyReference& ref, const Launch& r, int good,
                   bool e4m3_mma) {
  const auto cmp = kdtree::ref::compare_verify(c, ref, r.out, r.lse.data());
  INFO("unaffected request " << good << ": " << cmp.summary());
  CHECK(cmp.rel_err[good] < rel_tolerance(c.spec.dtype, e4m3_mma));
}

}  // namespace

TEST_CASE("verify_attention GPU parity: mla576/512") { run_head_grid(576, 512, 0); }

// The e4m3 MMA path (sm_120's path for e4m3 caches; on sm_89/sm_90 the same source
// with the plain e4m3 MMA) on whatever GPU runs the tests, in a runtime of its own
// with KDTREE_VERIFY_TILES set: the grid's e4m3 points only.
struct E4m3MmaSession {
  kdtree::test::EnvVar tiles;
  Session session;
  explicit E4m3MmaSession(const char* tiles_value) : tiles("KDTREE_VERIFY_TILES", tiles_value) {
    session.e4m3_mma = true;
  }
  bool runs() {
    const int sm = session_sm(session);
    if (sm < 89) MESSAGE("not run: the e4m3 MMA path needs sm_89 or newer, this GPU is sm_" << sm);
    return sm >= 89;
  }
};

TEST_CASE("verify_attention GPU parity: e4m3 MMA path (tiles mma=e4m3), every head") {
  E4m3MmaSession e("mma=e4m3");
  if (!e.runs()) return;
  run_head_grid(576, 512, 0, e.session);
  run_head_grid(64, 64, 1, e.session);
  run_head_grid(128, 128, 2, e.session);
  run_head_grid(256, 256, 3, e.session);
}

// sm_120's MLA and gqa256 e4m3 kernels themselves (their tiles; gqa64's and gqa128's
// are sm_90's too): MLA's is the qsplit kernel's e4m3 MMA path (Q as e4m3 codes in
// registers, 32-token tiles, packed rows, stream-K plans).
TEST_CASE(
    "verify_attention GPU parity: mla576/512 e4m3 MMA path with sm_120's tiles "
    "(kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3)") {
  E4m3MmaSession e("kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3");
  if (!e.runs()) return;
  run_head_grid(576, 512, 8, e.session);
}

// Tiles forced on sm_90 GPUs only (not run on others): by default the wgmma family
// (templates/verify_attention_wgmma.cu: warpgroup MMAs, sm_90a only; sm_90's MLA
// default for 16-bit caches, the grid's 16-bit points), so these cases keep running
// it whatever the generator prefers (tiles_value "": the generator's own tiles). `schedule`
// as QsplitSession's.
struct Sm90TilesSession {
  static constexpr const char* kTiles = "kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16";
  kdtree::test::EnvVar tiles;
  kdtree::test::EnvVar schedule;
  Session session;
  explicit Sm90TilesSession(const char* schedule_value = "", const char* tiles_value = kTiles, bool kv16_only = true)
      : tiles("KDTREE_VERIFY_TILES", tiles_value), schedule("KDTREE_VERIFY_SCHEDULE", schedule_value) {
    session.kv16_only = kv16_only;
  }
  bool runs() {
    const int sm = session_sm(session);
    if (sm != 90) MESSAGE("not run: these tiles are sm_90's (wgmma: sm_90a only), this GPU is sm_" << sm);
    return sm == 90;
  }
};

// Uniform splits merged in a thread-block cluster (KDTREE_VERIFY_SCHEDULE=cluster: the
// kdtree_verify_attention_cluster entry, no partials, no combine). The kernels with
// that entry: sm_120's MLA e4m3 kernel (its tiles, on whatever sm_90+ GPU runs the
// tests) and sm_90's MLA wgmma kernels (the default tiles there, both cache types).
struct QsplitClusterSession {
  static constexpr const char* kTiles = "kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3";
  E4m3MmaSession e4m3{kTiles};
  kdtree::test::EnvVar schedule{"KDTREE_VERIFY_SCHEDULE", "cluster"};
  Session& session = e4m3.session;
  bool runs() {
    const int sm = session_sm(session);
    if (sm < 90) MESSAGE("not run: thread-block clusters need sm_90 or newer, this GPU is sm_" << sm);
    return sm >= 90;
  }
};

// Every cluster size, on uneven requests: a short request leaves the later splits of
// its clusters past its kv_len (they stash nothing and still merge their rows).
void check_cluster_sizes(Session& s, kdtree_kv_dtype kv_dtype, uint64_t seed) {
  s.bind();
  for (const int heads : {8, 16, 128}) {
    VerifyCaseOptions o;
    o.prefix_lens = {3000, 40, 700};
    o.node_counts = {heads == 128 ? 5 : 16, 1, 9};
    const kdtree_dtype dtype = heads == 16 ? KDTREE_DTYPE_F16 : KDTREE_DTYPE_BF16;
    const kdtree_verify_spec spec = make_verify_spec(576, 512, heads, 1, 16, 16, dtype, kv_dtype);
    const VerifyCase c = kdtree::ref::build_verify_case(spec, 3, seed++, o);
    const auto ref = kdtree::ref::verify_attention(c.host_inputs());
    DeviceCase d = upload(s.rt, c, 8);  // the workspace of 8 uniform splits (a cluster plan needs none)
    const bool e4m3_mma = takes_e4m3_mma(s, spec);
    for (int splits = 2; splits <= 8; ++splits) check_launch(s.rt, c, ref, d, splits, splits % 2 == 0, e4m3_mma);
    check_launch(s.rt, c, ref, d, 0, true, e4m3_mma);
  }
}

TEST_CASE(
    "verify_attention GPU parity: mla576/512 e4m3 MMA path, splits merged in a cluster "
    "(KDTREE_VERIFY_SCHEDULE=cluster, tiles kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,"
    "mma=e4m3)") {
  QsplitClusterSession q;
  if (!q.runs()) return;
  run_head_grid(576, 512, 16, q.session);
}

TEST_CASE("verify_attention GPU parity: qsplit e4m3 cluster merge, 2..8 splits, uneven lengths") {
  QsplitClusterSession q;
  if (!q.runs()) return;
  check_cluster_sizes(q.session, KDTREE_KV_DTYPE_E4M3, base_seed() * 1000 + 960);
}

TEST_CASE(
    "verify_attention GPU parity: mla576/512 wgmma, splits merged in a cluster "
    "(KDTREE_VERIFY_SCHEDULE=cluster, sm_90's default tiles, 16-bit and e4m3 caches)") {
  Sm90TilesSession w("cluster", "", false);
  if (!w.runs()) return;
  run_head_grid(576, 512, 17, w.session);
}

// Both cache types' requests of check_cluster_sizes on sm_90's own kernels with `schedule`.
void check_wgmma_sizes(const char* schedule) {
  Sm90TilesSession w(schedule, "", false);
  if (!w.runs()) return;
  check_cluster_sizes(w.session, KDTREE_KV_DTYPE_AS_Q, base_seed() * 1000 + 950);
  check_cluster_sizes(w.session, KDTREE_KV_DTYPE_E4M3, base_seed() * 1000 + 955);
}

TEST_CASE("verify_attention GPU parity: wgmma cluster merge, 2..8 splits, uneven lengths, 16-bit and e4m3 caches") {
  check_wgmma_sizes("cluster");
}

// The same requests and split counts through the usual uniform splits (partials and the
// combine), for comparison and for compute-sanitizer.
TEST_CASE("verify_attention GPU parity: wgmma uniform splits, 2..8 splits, uneven lengths, 16-bit and e4m3 caches") {
  check_wgmma_sizes("splits");
}

// The flash kernel's MLA e4m3 MMA tiles that fit sm_120 (its choice before qsplit had the path).
TEST_CASE(
    "verify_attention GPU parity: mla576/512 e4m3 MMA path, flash tiles that fit sm_120 "
    "(kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=16,mma=e4m3)") {
  E4m3MmaSession e("kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=16,mma=e4m3");
  if (!e.runs()) return;
  run_head_grid(576, 512, 6, e.session);
}

TEST_CASE(
    "verify_attention GPU parity: gqa256 e4m3 MMA path with 4-warp tiles (sm_120's before its 8-warp ones, "
    "kernel=flash,block_m=64,block_n=64,warps=4,stages=2,warp_rows=16,mma=e4m3)") {
  E4m3MmaSession e("kernel=flash,block_m=64,block_n=64,warps=4,stages=2,warp_rows=16,mma=e4m3");
  if (!e.runs()) return;
  run_head_grid(256, 256, 7, e.session);
}
TEST_CASE("verify_attention GPU parity: gqa64") { run_head_grid(64, 64, 1); }
TEST_CASE("verify_attention GPU parity: gqa128") { run_head_grid(128, 128, 2); }
TEST_CASE("verify_attention GPU parity: gqa256") { run_head_grid(256, 256, 3); }

// sm_120's GQA tile candidates at its 1024 FLOP/clk/SM tensor rate (docs/PERFORMANCE.md, "sm_120: GQA tiles
// at the measured tensor rate"): 8 warps of 16 rows, on whatever GPU runs the tests, in runtimes of their
// own. The generator chooses a candidate only once it passes here and the model's H200 rows hold at it:
// gqa256's (both cache types) since it did; gqa64's and gqa128's did not hold.
void run_gqa_candidates(int head, const char* tiles16, const char* tiles_e4m3, int head_index) {
  {
    INFO("KDTREE_VERIFY_TILES=" << tiles16);
    kdtree::test::EnvVar tiles("KDTREE_VERIFY_TILES", tiles16);
    Session s;
    s.kv16_only = true;
    run_head_grid(head, head, head_index, s);
  }
  INFO("KDTREE_VERIFY_TILES=" << tiles_e4m3);
  E4m3MmaSession e(tiles_e4m3);
  if (e.runs()) run_head_grid(head, head, head_index + 1, e.session);
}

TEST_CASE(
    "verify_attention GPU parity: gqa64 with sm_120's candidate tiles "
    "(kernel=flash,block_m=128,block_n=32,warps=8,stages=4,warp_rows=16, e4m3: stages=3,mma=e4m3)") {
  run_gqa_candidates(64, "kernel=flash,block_m=128,block_n=32,warps=8,stages=4,warp_rows=16",
                     "kernel=flash,block_m=128,block_n=32,warps=8,stages=3,warp_rows=16,mma=e4m3", 20);
}

TEST_CASE(
    "verify_attention GPU parity: gqa128 with sm_120's candidate tiles "
    "(kernel=flash,block_m=128,block_n=64,warps=8,stages=2,warp_rows=16, e4m3: block_m=64,block_n=32,warps=4)") {
  run_gqa_candidates(128, "kernel=flash,block_m=128,block_n=64,warps=8,stages=2,warp_rows=16",
                     "kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16,mma=e4m3", 22);
}

TEST_CASE(
    "verify_attention GPU parity: gqa256 with sm_120's candidate tiles, its tiles now "
    "(kernel=flash,block_m=128,block_n=16,warps=8,stages=2,warp_rows=16, e4m3: block_n=32,stages=3,mma=e4m3)") {
  run_gqa_candidates(256, "kernel=flash,block_m=128,block_n=16,warps=8,stages=2,warp_rows=16",
                     "kernel=flash,block_m=128,block_n=32,warps=8,stages=3,warp_rows=16,mma=e4m3", 24);
}

void check_page_index_errors(Session& s, const std::vector<kdtree_verify_spec>& specs) {
  s.bind();
  uint64_t seed = base_seed() * 1000 + 900;
  for (const kdtree_verify_spec& spec : specs) {
    VerifyCase c = error_case(spec, seed++);
    const auto ref = kdtree::ref::verify_attention(c.host_inputs());
    for (int bad : {c.num_pages, -1, c.num_pages + 1000}) {
      VerifyCase m = c;
      m.page_table[size_t(1) * m.max_pages_per_req + 0] = bad;  // request 1's first prefix page
      DeviceCase d = upload(s.rt, m, 3);
      for (int splits : {1, 3, 0}) {
        INFO(m.label("page id " + std::to_string(bad) + ",splits=" + std::to_string(splits)));
        const Launch r = launch(s.rt, m, d, true, splits, 0x00);
        INFO("kdtree_last_error: " << r.error);
        CHECK(r.status == KDTREE_OK);  // checked on the device: no host synchronisation
        CHECK((r.flags & KDTREE_DEVICE_ERROR_PAGE_INDEX) != 0);
        CHECK(kdtree::ref::request_all_nan(m, 1, r.out, r.lse.data()));
        check_request(m, ref, r, 0, takes_e4m3_mma(s, m.spec));
      }
    }
  }
}

TEST_CASE("verify_attention GPU: a page id out of range flags PAGE_INDEX and NaNs that request") {
  check_page_index_errors(Session::get(), error_specs());
}

void check_node_count_errors(Session& s, const std::vector<kdtree_verify_spec>& specs) {
  s.bind();
  uint64_t seed = base_seed() * 1000 + 950;
  for (const kdtree_verify_spec& spec : specs) {
    const VerifyCase c = error_case(spec, seed++);
    const auto ref = kdtree::ref::verify_attention(c.host_inputs());
    const int W = spec.max_tree_nodes, hq = spec.num_q_heads;
    // Request 0 gets W + 1 nodes (a copy of its root appended); kv_len stays, so
    // only the node count is wrong.
    VerifyCase m = c;
    const size_t q_row = size_t(hq) * spec.head_dim_qk;
    m.q.insert(m.q.begin() + W * q_row, c.q.begin(), c.q.begin() + q_row);
    m.tree_mask.insert(m.tree_mask.begin() + size_t(W) * m.mask_words, c.tree_mask.begin(),
                       c.tree_mask.begin() + m.mask_words);
    m.parents.insert(m.parents.begin() + W, 0);
    m.node_counts[0] = W + 1;
    m.node_indptr = {0, W + 1, W + 1 + c.node_counts[1]};
    m.total_nodes = m.node_indptr.back();
    // The expected rows of request 1 are the original case's, one row later.
    kdtree::ref::VerifyReference ref_m;
    ref_m.out.assign(m.out_elems(), 0.0);
    ref_m.lse.assign(m.lse_elems(), 0.0);
    std::copy(ref.out.begin() + size_t(W) * hq * spec.head_dim_v, ref.out.end(),
              ref_m.out.begin() + size_t(W + 1) * hq * spec.head_dim_v);
    std::copy(ref.lse.begin() + size_t(W) * hq, ref.lse.end(), ref_m.lse.begin() + size_t(W + 1) * hq);
    DeviceCase d = upload(s.rt, m, 3);
    for (int splits : {1, 3, 0}) {
      INFO(m.label("nodes=W+1,splits=" + std::to_string(splits)));
      const Launch r = launch(s.rt, m, d, true, splits, 0x00);
      INFO("kdtree_last_error: " << r.error);
      CHECK(r.status == KDTREE_OK);
      CHECK((r.flags & KDTREE_DEVICE_ERROR_NODE_COUNT) != 0);
      CHECK(kdtree::ref::request_all_nan(m, 0, r.out, r.lse.data()));  // all W + 1 rows, none stale
      check_request(m, ref_m, r, 1, takes_e4m3_mma(s, m.spec));
    }
    // kv_len smaller than the node count.
    VerifyCase short_kv = c;
    short_kv.kv_lens[0] = c.node_counts[0] - 1;
    DeviceCase ds = upload(s.rt, short_kv, 3);
    for (int splits : {1, 3, 0}) {
      INFO(short_kv.label("kv_len<nodes,splits=" + std::to_string(splits)));
      const Launch r = launch(s.rt, short_kv, ds, true, splits, 0x00);
      CHECK(r.status == KDTREE_OK);
      CHECK((r.flags & KDTREE_DEVICE_ERROR_NODE_COUNT) != 0);
      CHECK(kdtree::ref::request_all_nan(short_kv, 0, r.out, r.lse.data()));
      check_request(short_kv, ref, r, 1, takes_e4m3_mma(s, short_kv.spec));
    }
  }
}

TEST_CASE("verify_attention GPU: a node count over W flags NODE_COUNT and NaNs that request") {
  check_node_count_errors(Session::get(), error_specs());
}

// sm_120's MLA kernel (templates/verify_attention_qsplit.cu: Q in registers) on
// whatever GPU runs the tests, with KDTREE_VERIFY_TILES set for the test and a
// runtime of its own (a runtime keeps one module per spec, whatever the tiles);
// `schedule` sets KDTREE_VERIFY_SCHEDULE for its automatic plans ("" leaves the
// choice to the cost model).
struct QsplitSession {
  static constexpr const char* kTiles = "kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32";
  kdtree::test::EnvVar tiles;
  kdtree::test::EnvVar schedule;
  Session session;
  explicit QsplitSession(const char* schedule_value = "")
      : tiles("KDTREE_VERIFY_TILES", kTiles), schedule("KDTREE_VERIFY_SCHEDULE", schedule_value) {}
};

TEST_CASE(
    "verify_attention GPU parity: mla576/512 qsplit (sm_120's kernel, tiles "
    "kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32)") {
  QsplitSession q;
  run_head_grid(576, 512, 4, q.session);
}

// Every automatic launch of the grid as stream-K: segments across items and
// requests, cut items merged from the CTAs' partial slots, and one CTA that runs
// the whole KV of its items.
TEST_CASE("verify_attention GPU parity: mla576/512 qsplit stream-K (KDTREE_VERIFY_SCHEDULE=stream)") {
  QsplitSession q("stream");
  run_head_grid(576, 512, 5, q.session);
}

// Stream-K with fewer units than SMs: one CTA (a single KV tile, no workspace),
// and a few CTAs whose ranges cut one item into one-tile pieces.
void check_stream_few_ctas(Session& s, uint64_t seed, kdtree_kv_dtype kv_dtype = KDTREE_KV_DTYPE_AS_Q) {
  s.bind();
  for (const auto& shape : {std::pair<int, int>{0, 1}, {40, 3}, {70, 16}}) {  // prefix, nodes
    VerifyCaseOptions o;
    o.prefix_lens = {shape.first};
    o.node_counts = {shape.second};
    kdtree_verify_spec spec = make_verify_spec(576, 512, 16, 1, 16, 16, KDTREE_DTYPE_BF16);
    spec.kv_dtype = kv_dtype;
    const VerifyCase c = kdtree::ref::build_verify_case(spec, 1, seed++, o);
    const auto ref = kdtree::ref::verify_attention(c.host_inputs());
    DeviceCase d = upload(s.rt, c, 3);
    check_launch(s.rt, c, ref, d, 0, true, takes_e4m3_mma(s, spec));
    check_launch(s.rt, c, ref, d, 0, false, takes_e4m3_mma(s, spec));
  }
}

TEST_CASE("verify_attention GPU parity: qsplit stream-K with one and with a few CTAs") {
  QsplitSession q("stream");
  check_stream_few_ctas(q.session, base_seed() * 1000 + 990);
}

TEST_CASE("verify_attention GPU: qsplit kernel flags and NaNs bad pages and node counts") {
  const std::vector<kdtree_verify_spec> mla = {error_specs()[0]};
  for (const char* schedule : {"splits", "stream"}) {
    INFO("KDTREE_VERIFY_SCHEDULE=" << schedule);
    QsplitSession q(schedule);
    check_page_index_errors(q.session, mla);
    check_node_count_errors(q.session, mla);
  }
}

// Bad pages and node counts NaN their requests' rows in every split of a cluster.
void check_cluster_errors(Session& s, std::vector<kdtree_kv_dtype> kv_dtypes) {
  std::vector<kdtree_verify_spec> specs;
  for (kdtree_kv_dtype kv : kv_dtypes) {
    specs.push_back(error_specs()[0]);
    specs.back().kv_dtype = kv;
  }
  check_page_index_errors(s, specs);
  check_node_count_errors(s, specs);
}

TEST_CASE("verify_attention GPU: qsplit e4m3 cluster merge flags and NaNs bad pages and node counts") {
  QsplitClusterSession q;
  if (!q.runs()) return;
  check_cluster_errors(q.session, {KDTREE_KV_DTYPE_E4M3});
}

TEST_CASE("verify_attention GPU: wgmma cluster merge flags and NaNs bad pages and node counts") {
  Sm90TilesSession w("cluster", "", false);
  if (!w.runs()) return;
  check_cluster_errors(w.session, {KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3});
}

TEST_CASE("verify_attention GPU: kv_len over max_kv_len flags KV_LEN and NaNs that request") {
  Session& s = Session::get();
  s.bind();
  uint64_t seed = base_seed() * 1000 + 980;
  for (const kdtree_verify_spec& spec : error_specs()) {
    VerifyCase c = error_case(spec, seed++);
    const auto ref = kdtree::ref::verify_attention(c.host_inputs());
    c.max_kv_len = c.kv_lens[0] - 1;  // the host bound is a lie for request 0 only
    REQUIRE(c.kv_lens[1] <= c.max_kv_len);
    DeviceCase d = upload(s.rt, c, 3);
    for (int splits : {1, 3, 0}) {
      INFO(c.label("max_kv_len<kv_len,splits=" + std::to_string(splits)));
      const Launch r = launch(s.rt, c, d, true, splits, 0x00);
      INFO("kdtree_last_error: " << r.error);
      CHECK(r.status == KDTREE_OK);
      CHECK((r.flags & KDTREE_DEVICE_ERROR_KV_LEN) != 0);
      CHECK(kdtree::ref::request_all_nan(c, 0, r.out, r.lse.data()));
      check_request(c, ref, r, 1, takes_e4m3_mma(s, c.spec));
    }
  }
}

// Bad scales are host errors: nothing is launched, so out, lse and error_flags
// keep their poison. The scale checks come before the kernel is generated, so
// this runs whether or not the build generates e4m3 kernels yet.
TEST_CASE("verify_attention GPU: bad e4m3 scales and scales on 16-bit caches never launch") {
  Session& s = Session::get();
  s.bind();
  uint64_t seed = base_seed() * 1000 + 970;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (kdtree_verify_spec spec : error_specs()) {
    for (kdtree_kv_dtype kv : {KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3}) {
      spec.kv_dtype = kv;
      const VerifyCase c = error_case(spec, seed++);
      DeviceCase d = upload_unplanned(c);
      const std::vector<float> bad_scales =
          kv == KDTREE_KV_DTYPE_E4M3 ? std::vector<float>{0.0f, -1.0f, nan, inf} : std::vector<float>{2.0f, -1.0f};
      for (const char* which : {"k_scale", "v_scale"}) {
        for (float bad : bad_scales) {
          INFO(c.label(std::string(which) + "=" + std::to_string(bad)));
          d.out.poison(0x5a);
          d.lse.poison(0x5a);
          d.flags.poison(0x5a);
          kdtree_verify_args a = make_args(c, d, true, 1);
          (std::string(which) == "k_scale" ? a.k_scale : a.v_scale) = bad;
          CHECK(kdtree_verify_attention(s.rt, &a) == KDTREE_ERROR_INVALID_ARGUMENT);
          const std::string msg = kdtree_last_error();
          INFO("kdtree_last_error: " << msg);
          CHECK(msg.find(which) != std::string::npos);
          for (unsigned char byte : d.out.download<unsigned char>()) REQUIRE(byte == 0x5a);
          for (unsigned char byte : d.lse.download<unsigned char>()) REQUIRE(byte == 0x5a);
          for (unsigned char byte : d.flags.download<unsigned char>()) REQUIRE(byte == 0x5a);
        }
      }
    }
  }
}

TEST_CASE(
    "verify_attention GPU parity: mla576/512 wgmma (sm_90's kernel, tiles "
    "kernel=wgmma,block_m=64,block_n=64,warps=8,stages=2,warp_rows=16)") {
  Sm90TilesSession w;
  if (!w.runs()) return;
  run_head_grid(576, 512, 11, w.session);
}

TEST_CASE("verify_attention GPU parity: mla576/512 wgmma stream-K (KDTREE_VERIFY_SCHEDULE=stream)") {
  Sm90TilesSession w("stream");
  if (!w.runs()) return;
  run_head_grid(576, 512, 12, w.session);
}

TEST_CASE("verify_attention GPU parity: wgmma stream-K with one and with a few CTAs") {
  Sm90TilesSession w("stream");
  if (!w.runs()) return;
  check_stream_few_ctas(w.session, base_seed() * 1000 + 980);
}

TEST_CASE("verify_attention GPU: wgmma kernel flags and NaNs bad pages and node counts") {
  const std::vector<kdtree_verify_spec> mla = {error_specs()[0]};
  for (const char* schedule : {"splits", "stream"}) {
    INFO("KDTREE_VERIFY_SCHEDULE=" << schedule);
    Sm90TilesSession w(schedule);
    if (!w.runs()) return;
    check_page_index_errors(w.session, mla);
    check_node_count_errors(w.session, mla);
  }
}

// The wgmma family's GQA kernel (templates/verify_attention_wgmma_gqa.cu: a producer
// warpgroup and two consumer warpgroups of 64 rows, uniform splits), over 16-bit caches
// and e4m3 ones (the producer dequantises: the dequantising path's tolerance).
TEST_CASE("verify_attention GPU parity: gqa64, gqa128, gqa256 wgmma (tiles kernel=wgmma)") {
  Sm90TilesSession w("", "kernel=wgmma", false);
  if (!w.runs()) return;
  run_head_grid(64, 64, 16, w.session);
  run_head_grid(128, 128, 17, w.session);
  run_head_grid(256, 256, 18, w.session);
}

TEST_CASE("verify_attention GPU: GQA wgmma kernel flags and NaNs bad pages and node counts") {
  // Both GQA specs over 16-bit caches, and the 64-dim one over e4m3 (the dequantising producer).
  std::vector<kdtree_verify_spec> gqa = {error_specs()[1], error_specs()[2], error_specs()[2]};
  gqa[2].kv_dtype = KDTREE_KV_DTYPE_E4M3;
  Sm90TilesSession w("", "kernel=wgmma", false);
  if (!w.runs()) return;
  check_page_index_errors(w.session, gqa);
  check_node_count_errors(w.session, gqa);
}

// The wgmma family over e4m3 caches (templates/verify_attention_wgmma_e4m3.cu: native
// e4m3 wgmma, Q and P quantised): the grid's e4m3 points, the e4m3 MMA tolerance.
constexpr const char* kWgmmaE4m3Tiles = "kernel=wgmma,block_m=64,block_n=64,warps=8,stages=4,warp_rows=16,mma=e4m3";
struct WgmmaE4m3Session : Sm90TilesSession {
  explicit WgmmaE4m3Session(const char* schedule_value = "")
      : Sm90TilesSession(schedule_value, kWgmmaE4m3Tiles, false) {
    session.e4m3_mma = true;
  }
};

TEST_CASE(
    "verify_attention GPU parity: mla576/512 wgmma e4m3 (tiles "
    "kernel=wgmma,block_m=64,block_n=64,warps=8,stages=4,warp_rows=16,mma=e4m3)") {
  WgmmaE4m3Session w;
  if (!w.runs()) return;
  run_head_grid(576, 512, 14, w.session);
}

TEST_CASE("verify_attention GPU parity: mla576/512 wgmma e4m3 stream-K (KDTREE_VERIFY_SCHEDULE=stream)") {
  WgmmaE4m3Session w("stream");
  if (!w.runs()) return;
  run_head_grid(576, 512, 15, w.session);
}

TEST_CASE("verify_attention GPU parity: wgmma e4m3 stream-K with one and with a few CTAs") {
  WgmmaE4m3Session w("stream");
  if (!w.runs()) return;
  check_stream_few_ctas(w.session, base_seed() * 1000 + 970, KDTREE_KV_DTYPE_E4M3);
}

TEST_CASE("verify_attention GPU: wgmma e4m3 kernel flags and NaNs bad pages and node counts") {
  kdtree_verify_spec spec = error_specs()[0];
  spec.kv_dtype = KDTREE_KV_DTYPE_E4M3;
  for (const char* schedule : {"splits", "stream"}) {
    INFO("KDTREE_VERIFY_SCHEDULE=" << schedule);
    WgmmaE4m3Session w(schedule);
    if (!w.runs()) return;
    check_page_index_errors(w.session, {spec});
    check_node_count_errors(w.session, {spec});
  }
}

// The portable flash kernel, which the wgmma family replaced as sm_90's MLA default
// for 16-bit caches, still checked there (elsewhere the main grid runs it).
TEST_CASE(
    "verify_attention GPU parity: mla576/512 flash on sm_90 (tiles "
    "kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32)") {
  Sm90TilesSession w("", "kernel=flash,block_m=64,block_n=64,warps=8,stages=2,warp_rows=32", false);
  if (!w.runs()) return;
  run_head_grid(576, 512, 13, w.session);
}
