// verify_step: one whole speculative verify step of an MLA model, without a model.
//
// A DeepSeek-style MLA setup (one 576-dim latent KV head, V = its first 512 dims,
// 16 query heads, 64-token pages, bf16, tree width W = 64), a batch of 4 requests
// whose 1-4K-token prefixes sit in scattered pages, and 2 layers of KV cache.
// Every operation of a verify step runs on the device, fed by the device outputs
// of the one before, as a server would chain them:
//   1. tree_build        random drafter top-K (D = 8, K = 8) -> draft tree (budget W - 1)
//   2. (the model)       the tree nodes' KV rows written through the page table, q per node
//   3. verify_attention  layer 0, with LSE
//   4. sample_tokens     planted target logits -> greedy targets (and one T = 0.8 run)
//   5. tree_accept       the longest matching path and the bonus token
//   6. kv_compact        the accepted rows moved, both layers in one launch
// Each result is checked against the CPU reference (exactly; attention to a
// relative error < 1e-2 per request), then each operation is timed with CUDA
// events (median of 20 calls after warm-up). Memory goes through the CUDA Driver
// API table kdtree loads.
//
//   verify_step [seed]      exit 0 = PASS (or no GPU: "skipped"), 1 = FAIL
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "examples/cuda_driver.hpp"
#include "kdtree/kdtree.h"
#include "kdtree/kdtree.hpp"
#include "reference/half.hpp"
#include "reference/kv_compact.hpp"
#include "reference/random_draft.hpp"
#include "reference/sample_tokens.hpp"
#include "reference/tree_accept.hpp"
#include "reference/tree_build.hpp"
#include "reference/verify_attention.hpp"
#include "reference/verify_case.hpp"

namespace {

namespace ref = kdtree::ref;

constexpr int kBatch = 4;
constexpr int kLayers = 2;
constexpr int kDepth = 8;   // D: drafter depth
constexpr int kTopK = 8;    // K: candidates per depth
constexpr int kW = 64;      // max_tree_nodes
constexpr int kHeads = 16;  // query heads
constexpr int kDqk = 576;   // MLA: 512 latent + 64 rope
constexpr int kDv = 512;
constexpr int kPage = 64;
constexpr int kVocab = 32000;
constexpr int kMinPrefix = 1000, kMaxPrefix = 4000;
constexpr int kExtraPages = 5;          // pages no request owns, left NaN: a stray read shows up
constexpr float kPlantedLogit = 10.0f;  // other logits are N(0, 1): greedy always finds the planted token
constexpr int kWarmup = 3, kRepeats = 20;
constexpr uint16_t kNaNBf16 = 0x7fc0;

using example::cu;

// Throws with kdtree's message when a C ABI call fails.
void check(kdtree_status status, const char* what) {
  if (status != KDTREE_OK) throw kdtree::Exception(status, std::string(what) + ": " + kdtree_last_error());
}

// A device allocation through the Driver API, poisoned (0xFF bytes: NaN, -1) so
// that an output a kernel leaves unwritten never passes.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    if (!bytes_) return;
    cu(cuMemAlloc(&ptr_, bytes_), "cuMemAlloc");
    cu(cuMemsetD8(ptr_, 0xFF, bytes_), "cuMemsetD8");
  }
  template <typename T>
  explicit DeviceMemory(const std::vector<T>& host) : DeviceMemory(host.size() * sizeof(T)) {
    if (bytes_) cu(cuMemcpyHtoD(ptr_, host.data(), bytes_), "cuMemcpyHtoD");
  }
  DeviceMemory(DeviceMemory&& o) noexcept : ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (ptr_) cuMemFree(ptr_);
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_) cu(cuMemcpyDtoH(host.data(), ptr_, bytes_), "cuMemcpyDtoH");
    return host;
  }
  template <typename T = void>
  T* get() const {
    return reinterpret_cast<T*>(ptr_);
  }
  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Counts mismatches over the whole step; reports the first differing element of an array.
struct Checker {
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    std::printf("  MISMATCH: %s\n", what.c_str());
    ++failures;
  }
  template <typename T>  // bitwise, so -inf scores and NaN poison compare exactly
  void same(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    if (got.size() != want.size()) {
      expect(false, what + ": " + std::to_string(got.size()) + " elements, expected " + std::to_string(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
        expect(false, what + " differs at element " + std::to_string(i) + ": got " + std::to_string(got[i]) +
                          ", expected " + std::to_string(want[i]));
        return;
      }
    }
  }
};

// Event-timed calls on the default stream (where every op here runs).
class Timer {
 public:
  Timer() {
    cu(cuEventCreate(&start_, 0), "cuEventCreate");
    cu(cuEventCreate(&stop_, 0), "cuEventCreate");
  }
  ~Timer() {
    cuEventDestroy(start_);
    cuEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Median of kRepeats calls after kWarmup; `prepare` runs before each call,
  // outside the timed span (kv_compact restores the cache there).
  template <typename Op, typename Prepare>
  double median_ms(Op&& op, Prepare&& prepare) {
    for (int i = 0; i < kWarmup; ++i) {
      prepare();
      op();
    }
    std::vector<float> ms(kRepeats);
    for (float& t : ms) {
      prepare();
      cu(cuEventRecord(start_, nullptr), "cuEventRecord");
      op();
      cu(cuEventRecord(stop_, nullptr), "cuEventRecord");
      cu(cuEventSynchronize(stop_), "cuEventSynchronize");
      cu(cuEventElapsedTime(&t, start_, stop_), "cuEventElapsedTime");
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  CUevent start_ = nullptr, stop_ = nullptr;
};

// Host wall time of one call up to its completion: the first call of an op
// includes the NVRTC compile (or the cubin cache load).
template <typename Op>
double wall_ms(Op&& op) {
  const auto t0 = std::chrono::steady_clock::now();
  op();
  cu(cuCtxSynchronize(), "cuCtxSynchronize");
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

uint16_t random_bf16(std::mt19937_64& rng) {
  return ref::float_to_bf16(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
}

// tree_build's outputs on the device, padded [B, W] per request.
struct DeviceTree {
  DeviceMemory tokens, parents, depths, positions, tree_mask, first_child, next_sibling, node_counts, scores;
};

struct Timing {
  std::string op;
  double first_ms = 0, median_ms = 0;
};

// What the steps hand on to each other: host copies of what the device holds
// (so each reference starts from the inputs the device saw) and the device buffers.
struct Step {
  kdtree_runtime* rt = nullptr;
  std::mt19937_64 rng;
  Checker checker;
  Timer timer;
  std::vector<Timing> timings;
  DeviceMemory flags{sizeof(int32_t)};  // KDTREE_DEVICE_ERROR_* word of the ops that take one

  // 1. the draft tree, as the device built it
  ref::TreeBuildInput draft;
  ref::TreeBuildOutput tree;
  DeviceTree d_tree;

  // 2. the paged KV cache (one per layer) and the queries; nodes packed by node_indptr
  std::vector<int32_t> node_indptr, kv_lens, page_table;
  int total_nodes = 0, num_pages = 0, max_pages_per_req = 0, max_kv_len = 0;
  std::vector<std::vector<uint16_t>> cache;  // [layer][num_pages, page, 576]
  std::vector<uint16_t> q;                   // [total_nodes, Hq, 576]
  std::vector<uint64_t> packed_mask;         // [total_nodes, 1]
  std::vector<DeviceMemory> d_cache;
  DeviceMemory d_q, d_packed_mask, d_node_indptr, d_kv_lens, d_page_table;

  // 4. the target's tokens (greedy), packed
  std::vector<int32_t> planted_steps;  // [B]: draft tokens the planted logits let through
  std::vector<int32_t> targets;
  DeviceMemory d_targets;

  // 5. the accepted paths
  std::vector<int32_t> accepted_path, accept_lens, bonus_tokens;
  DeviceMemory d_accepted_path, d_accept_lens, d_bonus_tokens;

  // The error word is cleared before an op's first (checked) call; timed repeats may OR into it later.
  void clear_flags() { cu(cuMemsetD32(flags.ptr(), 0, 1), "cuMemsetD32"); }
  int32_t read_flags() const { return flags.download<int32_t>()[0]; }
  void record(const char* op, double first_ms, double median_ms) { timings.push_back({op, first_ms, median_ms}); }
  int prefix(int b) const { return draft.prefix_lens[b]; }
  int nodes(int b) const { return tree.node_counts[b]; }
  size_t physical_row(int b, int pos) const {  // through the page table
    return size_t(page_table[size_t(b) * max_pages_per_req + pos / kPage]) * kPage + pos % kPage;
  }
};

kdtree_verify_spec mla_spec() {
  kdtree_verify_spec spec{};
  spec.head_dim_qk = kDqk;
  spec.head_dim_v = kDv;
  spec.num_q_heads = kHeads;
  spec.num_kv_heads = 1;
  spec.page_size = kPage;
  spec.max_tree_nodes = kW;
  spec.dtype = KDTREE_DTYPE_BF16;
  return spec;
}

// ---------------------------------------------------------------- 1. tree_build

// The drafter's per-depth top-K becomes the draft tree on the device, for the whole batch.
void build_tree(Step& s) {
  std::printf("1. tree_build [W=%d,D=%d,K=%d,B=%d] budget %d\n", kW, kDepth, kTopK, kBatch, kW - 1);
  s.draft = ref::random_draft(s.rng, kBatch, kDepth, kTopK, kW - 1, kW);
  std::uniform_int_distribution<int> prefix(kMinPrefix, kMaxPrefix);
  for (int32_t& p : s.draft.prefix_lens) p = prefix(s.rng);

  const DeviceMemory draft_tokens(s.draft.draft_tokens), draft_logprobs(s.draft.draft_logprobs),
      root_tokens(s.draft.root_tokens), prefix_lens(s.draft.prefix_lens);
  const size_t rows = size_t(kBatch) * kW;
  DeviceTree& t = s.d_tree;
  t.tokens = DeviceMemory(rows * 4);
  t.parents = DeviceMemory(rows * 4);
  t.depths = DeviceMemory(rows * 4);
  t.positions = DeviceMemory(rows * 4);
  t.tree_mask = DeviceMemory(rows * 8);  // one mask word per node: W = 64
  t.first_child = DeviceMemory(rows * 4);
  t.next_sibling = DeviceMemory(rows * 4);
  t.node_counts = DeviceMemory(size_t(kBatch) * 4);
  t.scores = DeviceMemory(rows * 4);

  kdtree_tree_build_args a{};
  a.batch_size = kBatch;
  a.depth = kDepth;
  a.top_k = kTopK;
  a.budget = kW - 1;  // the root takes the last node
  a.max_tree_nodes = kW;
  a.draft_tokens = draft_tokens.get<const int32_t>();
  a.draft_logprobs = draft_logprobs.get<const float>();
  a.root_tokens = root_tokens.get<const int32_t>();
  a.prefix_lens = prefix_lens.get<const int32_t>();
  a.tokens = t.tokens.get<int32_t>();
  a.parents = t.parents.get<int32_t>();
  a.depths = t.depths.get<int32_t>();
  a.positions = t.positions.get<int32_t>();
  a.tree_mask = t.tree_mask.get<uint64_t>();
  a.first_child = t.first_child.get<int32_t>();
  a.next_sibling = t.next_sibling.get<int32_t>();
  a.node_counts = t.node_counts.get<int32_t>();
  a.scores = t.scores.get<float>();
  const auto op = [&] { check(kdtree_tree_build(s.rt, &a), "kdtree_tree_build"); };
  const double first_ms = wall_ms(op);

  // The later steps build on the device's tree, so a tree_build bug cannot hide behind the reference's.
  s.tree.mask_words = 1;
  s.tree.tokens = t.tokens.download<int32_t>();
  s.tree.parents = t.parents.download<int32_t>();
  s.tree.depths = t.depths.download<int32_t>();
  s.tree.positions = t.positions.download<int32_t>();
  s.tree.tree_mask = t.tree_mask.download<uint64_t>();
  s.tree.first_child = t.first_child.download<int32_t>();
  s.tree.next_sibling = t.next_sibling.download<int32_t>();
  s.tree.node_counts = t.node_counts.download<int32_t>();
  s.tree.scores = t.scores.download<float>();

  const ref::TreeBuildOutput want = ref::tree_build(s.draft);
  s.checker.same("tree_build node_counts", s.tree.node_counts, want.node_counts);
  s.checker.same("tree_build tokens", s.tree.tokens, want.tokens);
  s.checker.same("tree_build parents", s.tree.parents, want.parents);
  s.checker.same("tree_build depths", s.tree.depths, want.depths);
  s.checker.same("tree_build positions", s.tree.positions, want.positions);
  s.checker.same("tree_build tree_mask", s.tree.tree_mask, want.tree_mask);
  s.checker.same("tree_build first_child", s.tree.first_child, want.first_child);
  s.checker.same("tree_build next_sibling", s.tree.next_sibling, want.next_sibling);
  s.checker.same("tree_build scores", s.tree.scores, want.scores);
  for (int b = 0; b < kBatch; ++b) {
    const int n = std::clamp(s.nodes(b), 0, kW);  // clamped: a bad count is reported above, not a crash here
    s.tree.node_counts[b] = n;
    const int32_t* depth = &s.tree.depths[size_t(b) * kW];
    std::printf("   request %d: %2d nodes, depth %d, root token %d\n", b, n,
                n ? *std::max_element(depth, depth + n) : 0, s.draft.root_tokens[b]);
  }
  s.record("tree_build", first_ms, s.timer.median_ms(op, [] {}));
}

// ---------------------------------------------------------------- 2. KV write + queries

// What the model does between tree_build and attention: the prefix is already
// cached; the tree nodes' KV rows are appended at positions prefix + i of every
// layer, through the page table; one query per node. From here on nodes are
// packed by node_indptr, as attention and sampling see them.
void write_tree_kv(Step& s) {
  s.node_indptr.assign(kBatch + 1, 0);
  s.kv_lens.resize(kBatch);
  for (int b = 0; b < kBatch; ++b) {
    s.node_indptr[b + 1] = s.node_indptr[b] + s.nodes(b);
    s.kv_lens[b] = s.prefix(b) + s.nodes(b);
  }
  s.total_nodes = s.node_indptr[kBatch];
  s.max_kv_len = *std::max_element(s.kv_lens.begin(), s.kv_lens.end());

  // Scattered pages: each request's logical pages are drawn from a random
  // permutation of the physical ones; one spare page-table column stays -1.
  std::vector<int> pages_needed(kBatch);
  for (int b = 0; b < kBatch; ++b) pages_needed[b] = (s.kv_lens[b] + kPage - 1) / kPage;
  s.num_pages = std::accumulate(pages_needed.begin(), pages_needed.end(), 0) + kExtraPages;
  s.max_pages_per_req = *std::max_element(pages_needed.begin(), pages_needed.end()) + 1;
  std::vector<int32_t> physical(s.num_pages);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), s.rng);
  s.page_table.assign(size_t(kBatch) * s.max_pages_per_req, -1);
  for (int b = 0, next = 0; b < kBatch; ++b)
    for (int p = 0; p < pages_needed[b]; ++p) s.page_table[size_t(b) * s.max_pages_per_req + p] = physical[next++];
  std::printf("2. KV write: %d pages of %d tokens (%d unused), %d layers, %d tree nodes\n", s.num_pages, kPage,
              kExtraPages, kLayers, s.total_nodes);

  // The cached prefix: random rows; every row no request owns is NaN.
  const size_t row_bytes = kDqk * sizeof(uint16_t);
  s.cache.assign(kLayers, std::vector<uint16_t>(size_t(s.num_pages) * kPage * kDqk, kNaNBf16));
  for (int l = 0; l < kLayers; ++l) {
    for (int b = 0; b < kBatch; ++b)
      for (int pos = 0; pos < s.prefix(b); ++pos) {
        uint16_t* row = &s.cache[l][s.physical_row(b, pos) * kDqk];
        for (int d = 0; d < kDqk; ++d) row[d] = random_bf16(s.rng);
      }
    s.d_cache.emplace_back(s.cache[l]);
  }
  // The tree nodes' rows, one row at a time, as the model's KV write would land them.
  for (int l = 0; l < kLayers; ++l)
    for (int b = 0; b < kBatch; ++b)
      for (int i = 0; i < s.nodes(b); ++i) {
        const size_t row = s.physical_row(b, s.prefix(b) + i);
        uint16_t* host = &s.cache[l][row * kDqk];
        for (int d = 0; d < kDqk; ++d) host[d] = random_bf16(s.rng);
        cu(cuMemcpyHtoD(s.d_cache[l].ptr() + row * row_bytes, host, row_bytes), "cuMemcpyHtoD");
      }

  s.q.resize(size_t(s.total_nodes) * kHeads * kDqk);
  for (uint16_t& x : s.q) x = random_bf16(s.rng);
  s.d_q = DeviceMemory(s.q);

  // tree_build's mask is padded [B, W]; attention reads it packed [total_nodes]: a device-side copy per request.
  s.d_packed_mask = DeviceMemory(size_t(s.total_nodes) * sizeof(uint64_t));
  s.packed_mask.clear();
  for (int b = 0; b < kBatch; ++b) {
    const size_t n = s.nodes(b), from = size_t(b) * kW;
    if (n)
      cu(cuMemcpyDtoD(s.d_packed_mask.ptr() + s.node_indptr[b] * sizeof(uint64_t),
                      s.d_tree.tree_mask.ptr() + from * sizeof(uint64_t), n * sizeof(uint64_t)),
         "cuMemcpyDtoD");
    s.packed_mask.insert(s.packed_mask.end(), s.tree.tree_mask.begin() + from, s.tree.tree_mask.begin() + from + n);
  }
  s.d_node_indptr = DeviceMemory(s.node_indptr);
  s.d_kv_lens = DeviceMemory(s.kv_lens);
  s.d_page_table = DeviceMemory(s.page_table);
}

// ---------------------------------------------------------------- 3. verify_attention

// The reference's view of layer 0's attention inputs.
ref::VerifyCase attention_case(const Step& s, float sm_scale) {
  ref::VerifyCase c;
  c.spec = mla_spec();
  c.mla = true;
  c.batch_size = kBatch;
  c.total_nodes = s.total_nodes;
  c.max_kv_len = s.max_kv_len;
  c.num_pages = s.num_pages;
  c.max_pages_per_req = s.max_pages_per_req;
  c.mask_words = 1;
  c.sm_scale = sm_scale;
  c.q = s.q;
  c.k_cache = s.cache[0];
  c.page_table = s.page_table;
  c.kv_lens = s.kv_lens;
  c.node_indptr = s.node_indptr;
  c.tree_mask = s.packed_mask;
  for (int b = 0; b < kBatch; ++b) {
    c.prefix_lens.push_back(s.prefix(b));
    c.node_counts.push_back(s.nodes(b));
  }
  return c;
}

void run_attention(Step& s) {
  const kdtree_verify_spec spec = mla_spec();
  const float sm_scale = float(1.0 / std::sqrt(double(kDqk)));
  std::printf("3. verify_attention [mla576/512,W=%d,page=%d,bf16,Hq=%d,B=%d] layer 0, longest KV %d\n", kW, kPage,
              kHeads, kBatch, s.max_kv_len);
  size_t workspace_bytes = 0;
  check(kdtree_verify_workspace_size(s.rt, &spec, kBatch, s.total_nodes, s.max_kv_len, &workspace_bytes),
        "kdtree_verify_workspace_size");
  DeviceMemory workspace(workspace_bytes);
  DeviceMemory out(size_t(s.total_nodes) * kHeads * kDv * sizeof(uint16_t));
  DeviceMemory lse(size_t(s.total_nodes) * kHeads * sizeof(float));

  kdtree_verify_args a{};
  a.spec = spec;
  a.batch_size = kBatch;
  a.total_nodes = s.total_nodes;
  a.max_kv_len = s.max_kv_len;
  a.num_pages = s.num_pages;
  a.q = s.d_q.get();
  a.node_indptr = s.d_node_indptr.get<const int32_t>();
  a.k_cache = s.d_cache[0].get();
  a.v_cache = nullptr;  // MLA: V is the first 512 dims of each cached row
  a.page_table = s.d_page_table.get<const int32_t>();
  a.max_pages_per_req = s.max_pages_per_req;
  a.kv_lens = s.d_kv_lens.get<const int32_t>();
  a.tree_mask = s.d_packed_mask.get<const uint64_t>();
  a.sm_scale = sm_scale;
  a.out = out.get();
  a.lse = lse.get<float>();
  a.workspace = workspace.get();
  a.workspace_size = workspace_bytes;
  a.error_flags = s.flags.get<int32_t>();
  a.num_splits = 0;  // chosen from the shape and the SM count
  const auto op = [&] { check(kdtree_verify_attention(s.rt, &a), "kdtree_verify_attention"); };
  s.clear_flags();
  const double first_ms = wall_ms(op);

  const std::vector<uint16_t> out_host = out.download<uint16_t>();
  const std::vector<float> lse_host = lse.download<float>();
  const int32_t flags = s.read_flags();
  const ref::VerifyCase c = attention_case(s, sm_scale);
  const ref::VerifyComparison cmp =
      ref::compare_verify(c, ref::verify_attention(c.host_inputs()), out_host, lse_host.data());
  for (int b = 0; b < kBatch; ++b)
    std::printf("   request %d: kv_len %4d (prefix %4d + %2d nodes), rel err %.3e\n", b, s.kv_lens[b], s.prefix(b),
                s.nodes(b), cmp.rel_err[b]);
  std::printf("   %s\n", cmp.summary().c_str());
  s.checker.expect(cmp.ok(1e-2, 1e-2), "verify_attention: " + cmp.summary());
  s.checker.expect(flags == 0, "verify_attention error_flags " + std::to_string(flags));
  s.record("verify_attention", first_ms, s.timer.median_ms(op, [] {}));
}

// ---------------------------------------------------------------- 4. sample_tokens

// The target tokens a model would produce, planted so that acceptance is not
// trivial: from the root, node n's target is the token of one random child for
// the first planted_steps[b] levels (drawn in 0..D, stopping early at a leaf);
// every other node's target is a random token that none of its children carries.
// So request b must accept exactly planted_steps[b] draft tokens.
std::vector<int32_t> plant_targets(Step& s) {
  std::uniform_int_distribution<int> token(0, kVocab - 1), steps(0, kDepth);
  std::vector<int32_t> targets(s.total_nodes);
  s.planted_steps.assign(kBatch, 0);
  for (int b = 0; b < kBatch; ++b) {
    const int32_t* tokens = &s.tree.tokens[size_t(b) * kW];
    const int32_t* parents = &s.tree.parents[size_t(b) * kW];
    std::vector<std::vector<int>> children(s.nodes(b));
    for (int i = 1; i < s.nodes(b); ++i)
      if (parents[i] >= 0 && parents[i] < i) children[parents[i]].push_back(i);
    if (s.nodes(b) == 0) continue;  // a bad count: tree_build's check has reported it
    int32_t* target = &targets[s.node_indptr[b]];
    for (int i = 0; i < s.nodes(b); ++i) {
      bool child_token;
      do {
        target[i] = token(s.rng);
        child_token =
            std::any_of(children[i].begin(), children[i].end(), [&](int c) { return tokens[c] == target[i]; });
      } while (child_token);
    }
    const int want_steps = steps(s.rng);
    for (int node = 0; s.planted_steps[b] < want_steps && !children[node].empty(); ++s.planted_steps[b]) {
      const int next = children[node][s.rng() % children[node].size()];
      target[node] = tokens[next];
      node = next;
    }
  }
  return targets;
}

// Sample args over all packed nodes' f32 logits; RNG offset = row index.
kdtree_sample_args sample_args(const Step& s, const DeviceMemory& logits, float temperature, uint64_t seed,
                               const DeviceMemory& out) {
  kdtree_sample_args a{};
  a.num_rows = s.total_nodes;
  a.vocab_size = kVocab;
  a.logits_dtype = KDTREE_DTYPE_F32;
  a.logits = logits.get();
  a.row_stride = 0;
  a.temperature = temperature;
  a.seed = seed;
  a.row_offsets = nullptr;
  a.out_tokens = out.get<int32_t>();
  return a;
}

void sample_targets(Step& s) {
  std::printf("4. sample_tokens [rows=%d,vocab=%d,f32]\n", s.total_nodes, kVocab);
  const std::vector<int32_t> planted = plant_targets(s);
  ref::SampleInput in;
  in.num_rows = s.total_nodes;
  in.vocab_size = kVocab;
  in.logits.resize(size_t(s.total_nodes) * kVocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : in.logits) x = normal(s.rng);
  for (int r = 0; r < s.total_nodes; ++r) in.logits[size_t(r) * kVocab + planted[r]] = kPlantedLogit;
  const DeviceMemory logits(in.logits);

  // Greedy: what acceptance uses. Exact against the reference and the planted tokens.
  s.d_targets = DeviceMemory(size_t(s.total_nodes) * sizeof(int32_t));
  const kdtree_sample_args greedy = sample_args(s, logits, 0.0f, 0, s.d_targets);
  const auto greedy_op = [&] { check(kdtree_sample_tokens(s.rt, &greedy), "kdtree_sample_tokens"); };
  const double greedy_first_ms = wall_ms(greedy_op);
  s.targets = s.d_targets.download<int32_t>();
  s.checker.same("sample_tokens greedy", s.targets, ref::sample_tokens(in));
  s.checker.same("sample_tokens greedy vs planted argmax", s.targets, planted);

  // T = 0.8, seed 42: the same counter-based RNG as the reference; a row may only
  // differ where two perturbed scores agree to the last ulps of log (as the GPU test allows).
  in.temperature = 0.8f;
  in.seed = 42;
  DeviceMemory sampled(size_t(s.total_nodes) * sizeof(int32_t));
  const kdtree_sample_args hot = sample_args(s, logits, in.temperature, in.seed, sampled);
  const auto hot_op = [&] { check(kdtree_sample_tokens(s.rt, &hot), "kdtree_sample_tokens"); };
  const double hot_first_ms = wall_ms(hot_op);
  const std::vector<int32_t> got = sampled.download<int32_t>(), want = ref::sample_tokens(in);
  int near_ties = 0, argmax = 0, greedy_argmax = 0;
  for (int r = 0; r < s.total_nodes; ++r) {
    greedy_argmax += s.targets[r] == planted[r];
    argmax += got[r] == planted[r];
    if (got[r] == want[r]) continue;
    const bool in_range = got[r] >= 0 && got[r] < kVocab;
    const float* row = &in.logits[size_t(r) * kVocab];
    const uint64_t key = ref::sample_row_key(in.seed, r);
    const float s_got = in_range ? ref::sample_score(row[got[r]], in.temperature, key, got[r]) : -INFINITY;
    const float s_want = ref::sample_score(row[want[r]], in.temperature, key, want[r]);
    const bool near_tie = std::fabs(s_got - s_want) <= 1e-5f * std::max(1.0f, std::fabs(s_want));
    s.checker.expect(near_tie, "sample_tokens T=0.8 row " + std::to_string(r) + ": got " + std::to_string(got[r]) +
                                   ", expected " + std::to_string(want[r]));
    near_ties += near_tie;
  }
  s.checker.expect(near_ties <= 1 + s.total_nodes / 1000, "sample_tokens T=0.8: too many near-tie differences");
  std::printf(
      "   greedy: %d of %d rows at the planted argmax; T=0.8 seed 42: %d of %d rows sampled it, "
      "%d near-tie differences from the reference\n",
      greedy_argmax, s.total_nodes, argmax, s.total_nodes, near_ties);
  s.record("sample_tokens greedy", greedy_first_ms, s.timer.median_ms(greedy_op, [] {}));
  s.record("sample_tokens T=0.8", hot_first_ms, s.timer.median_ms(hot_op, [] {}));
}

// ---------------------------------------------------------------- 5. tree_accept

void accept_paths(Step& s) {
  std::printf("5. tree_accept [W=%d,B=%d] packed targets\n", kW, kBatch);
  s.d_accepted_path = DeviceMemory(size_t(kBatch) * kW * sizeof(int32_t));
  s.d_accept_lens = DeviceMemory(size_t(kBatch) * sizeof(int32_t));
  s.d_bonus_tokens = DeviceMemory(size_t(kBatch) * sizeof(int32_t));
  kdtree_tree_accept_args a{};
  a.batch_size = kBatch;
  a.max_tree_nodes = kW;
  a.tokens = s.d_tree.tokens.get<const int32_t>();
  a.parents = s.d_tree.parents.get<const int32_t>();
  a.node_counts = s.d_tree.node_counts.get<const int32_t>();
  a.target_tokens = s.d_targets.get<const int32_t>();  // packed [total_nodes], straight from sample_tokens
  a.node_indptr = s.d_node_indptr.get<const int32_t>();
  a.total_nodes = s.total_nodes;
  a.accepted_path = s.d_accepted_path.get<int32_t>();
  a.accept_lens = s.d_accept_lens.get<int32_t>();
  a.bonus_tokens = s.d_bonus_tokens.get<int32_t>();
  a.error_flags = s.flags.get<int32_t>();
  const auto op = [&] { check(kdtree_tree_accept(s.rt, &a), "kdtree_tree_accept"); };
  s.clear_flags();
  const double first_ms = wall_ms(op);

  s.accepted_path = s.d_accepted_path.download<int32_t>();
  s.accept_lens = s.d_accept_lens.download<int32_t>();
  s.bonus_tokens = s.d_bonus_tokens.download<int32_t>();
  const int32_t flags = s.read_flags();
  ref::TreeAcceptInput in;
  in.batch_size = kBatch;
  in.max_tree_nodes = kW;
  in.tokens = s.tree.tokens;
  in.parents = s.tree.parents;
  in.node_counts = s.tree.node_counts;
  in.target_tokens = s.targets;
  in.node_indptr = s.node_indptr;
  const ref::TreeAcceptOutput want = ref::tree_accept(in);
  s.checker.same("tree_accept accepted_path", s.accepted_path, want.accepted_path);
  s.checker.same("tree_accept accept_lens", s.accept_lens, want.accept_lens);
  s.checker.same("tree_accept bonus_tokens", s.bonus_tokens, want.bonus_tokens);
  s.checker.same("tree_accept accept_lens vs planted steps", s.accept_lens, s.planted_steps);
  s.checker.expect(flags == want.error_flags, "tree_accept error_flags " + std::to_string(flags) + ", expected " +
                                                  std::to_string(want.error_flags));
  for (int b = 0; b < kBatch; ++b) {
    std::string path;
    for (int j = 0; j <= std::clamp(s.accept_lens[b], -1, kW - 1); ++j)
      path += (j ? " " : "") + std::to_string(s.accepted_path[size_t(b) * kW + j]);
    std::printf("   request %d: accepted %d of %d planted, bonus token %d, path [%s]\n", b, s.accept_lens[b],
                s.planted_steps[b], s.bonus_tokens[b], path.c_str());
  }
  s.record("tree_accept", first_ms, s.timer.median_ms(op, [] {}));
}

// ---------------------------------------------------------------- 6. kv_compact

void compact_kv(Step& s) {
  std::printf("6. kv_compact [mla576,W=%d,page=%d,bf16,B=%d] %d layers in one launch\n", kW, kPage, kBatch, kLayers);
  std::vector<uint64_t> layer_ptrs;
  for (const DeviceMemory& c : s.d_cache) layer_ptrs.push_back(c.ptr());
  const DeviceMemory k_caches(layer_ptrs);
  // kv_compact moves rows in place, so it is not idempotent: timed calls start
  // from a pristine copy of the caches, restored outside the timed span.
  std::vector<DeviceMemory> pristine;
  for (const DeviceMemory& c : s.d_cache) {
    pristine.emplace_back(c.bytes());
    cu(cuMemcpyDtoD(pristine.back().ptr(), c.ptr(), c.bytes()), "cuMemcpyDtoD");
  }

  kdtree_kv_compact_args a{};
  a.num_layers = kLayers;
  a.batch_size = kBatch;
  a.max_tree_nodes = kW;
  a.page_size = kPage;
  a.num_pages = s.num_pages;
  a.row_elems_k = kDqk;
  a.row_elems_v = 0;  // MLA: one cache
  a.dtype = KDTREE_DTYPE_BF16;
  a.k_caches = k_caches.get<const uint64_t>();
  a.v_caches = nullptr;
  a.page_table = s.d_page_table.get<const int32_t>();
  a.max_pages_per_req = s.max_pages_per_req;
  a.kv_lens = s.d_kv_lens.get<const int32_t>();  // before compaction: prefix + n_b
  a.node_counts = s.d_tree.node_counts.get<const int32_t>();
  a.accepted_path = s.d_accepted_path.get<const int32_t>();
  a.accept_lens = s.d_accept_lens.get<const int32_t>();
  a.error_flags = s.flags.get<int32_t>();
  const auto op = [&] { check(kdtree_kv_compact(s.rt, &a), "kdtree_kv_compact"); };
  s.clear_flags();
  const double first_ms = wall_ms(op);

  const int32_t flags = s.read_flags();
  ref::KvCompactInput in;
  in.batch_size = kBatch;
  in.max_tree_nodes = kW;
  in.page_size = kPage;
  in.num_pages = s.num_pages;
  in.max_pages_per_req = s.max_pages_per_req;
  in.page_table = s.page_table;
  in.kv_lens = s.kv_lens;
  in.node_counts = s.tree.node_counts;
  in.accepted_path = s.accepted_path;
  in.accept_lens = s.accept_lens;
  int want_flags = 0;
  for (int l = 0; l < kLayers; ++l) {
    want_flags = ref::kv_compact(in, s.cache[l], kDqk);  // the whole cache, bit for bit
    s.checker.same("kv_compact layer " + std::to_string(l), s.d_cache[l].download<uint16_t>(), s.cache[l]);
  }
  s.checker.expect(flags == want_flags,
                   "kv_compact error_flags " + std::to_string(flags) + ", expected " + std::to_string(want_flags));
  for (int b = 0; b < kBatch; ++b)
    std::printf("   request %d: %d rows moved per layer, kv_len %d -> %d\n", b, ref::kv_compact_moved_rows(in, b),
                s.kv_lens[b], s.prefix(b) + s.accept_lens[b] + 1);

  const auto restore = [&] {
    for (int l = 0; l < kLayers; ++l)
      cu(cuMemcpyDtoD(s.d_cache[l].ptr(), pristine[l].ptr(), pristine[l].bytes()), "cuMemcpyDtoD");
  };
  s.record("kv_compact", first_ms, s.timer.median_ms(op, restore));
}

// ---------------------------------------------------------------- the step

void print_summary(const Step& s) {
  std::printf("\naccepted draft tokens per request:");
  for (int b = 0; b < kBatch; ++b) std::printf(" %d", s.accept_lens[b]);
  std::printf("\nbonus tokens:");
  for (int b = 0; b < kBatch; ++b) std::printf(" %d", s.bonus_tokens[b]);
  std::printf("\n\n%-22s %16s %12s\n", "op", "first call ms", "median us");
  double step_us = 0;
  for (const Timing& t : s.timings) {
    std::printf("%-22s %16.2f %12.2f\n", t.op.c_str(), t.first_ms, t.median_ms * 1e3);
    if (t.op != "sample_tokens T=0.8") step_us += t.median_ms * 1e3;  // the step uses the greedy targets
  }
  std::printf("%-22s %16s %12.2f\n", "verify step (greedy)", "", step_us);
  std::printf(
      "(first call: NVRTC compile or cubin cache load + run, host wall time; median: CUDA events, %d calls "
      "after %d warm-up)\n",
      kRepeats, kWarmup);
}

int run(uint64_t seed) {
  kdtree_runtime* rt = nullptr;
  check(kdtree_runtime_create(0, nullptr, &rt), "kdtree_runtime_create");
  struct Destroy {
    kdtree_runtime* rt;
    ~Destroy() { kdtree_runtime_destroy(rt); }
  } destroy{rt};
  check(kdtree_runtime_bind_context(rt), "kdtree_runtime_bind_context");
  int sm = 0;
  check(kdtree_runtime_arch(rt, &sm), "kdtree_runtime_arch");
  std::printf("verify_step: MLA 576/512, Hq=%d, page %d, W=%d, bf16, B=%d, %d layers on sm_%d, seed %llu\n", kHeads,
              kPage, kW, kBatch, kLayers, sm, (unsigned long long)seed);

  int failures = 0;
  {
    Step s;  // device memory inside: freed before the runtime goes
    s.rt = rt;
    s.rng.seed(seed);
    build_tree(s);
    write_tree_kv(s);
    run_attention(s);
    sample_targets(s);
    accept_paths(s);
    compact_kv(s);
    print_summary(s);
    failures = s.checker.failures;
  }
  std::printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  std::string why;
  if (!example::gpu_available(&why)) {
    std::printf("verify_step: skipped: no GPU (%s)\n", why.c_str());
    return 0;
  }
  try {
    return run(seed);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verify_step: %s\nFAIL\n", e.what());
    return 1;
  }
}
