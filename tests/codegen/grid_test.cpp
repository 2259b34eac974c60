#include "codegen/grid.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

#include "base/error.hpp"
#include "codegen/verify_attention.hpp"

using kdtree::codegen::enumerate_grid;
using kdtree::codegen::GridItem;
using kdtree::codegen::GridOptions;
using kdtree::codegen::supported_kv_dtypes;
using kdtree::codegen::VerifySpec;

namespace {

const kdtree::codegen::Arch kSm120 = kdtree::codegen::arch_from_sm(120);

size_t count_prefix(const std::vector<GridItem>& items, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(items.begin(), items.end(),
                                           [&](const GridItem& item) { return item.label.rfind(prefix, 0) == 0; }));
}

bool has_label(const std::vector<GridItem>& items, const std::string& label) {
  return std::any_of(items.begin(), items.end(), [&](const GridItem& i) { return i.label == label; });
}

// The message of the error enumerate_grid throws for `options`; its status in *status.
std::string grid_error(const GridOptions& options, kdtree_status* status) {
  try {
    enumerate_grid(options, kSm120);
  } catch (const kdtree::Error& e) {
    *status = e.status();
    return e.what();
  }
  *status = KDTREE_OK;
  return "";
}

}  // namespace

TEST_CASE("grid: the default grid has every documented kernel once") {
  const auto items = enumerate_grid(GridOptions{}, kSm120);
  // 4 heads x 4 widths x 3 pages x 2 dtypes x the KV dtypes codegen generates
  // (as_q and e4m3); tree_build, tree_accept and tree_allocate
  // per width; kv_compact per width and page; sample_tokens for bf16 and f32 logits.
  const int kv = int(supported_kv_dtypes().size());
  CHECK(GridOptions{}.kv_dtypes == supported_kv_dtypes());
  CHECK(count_prefix(items, "verify_attention[") == 96 * kv);
  CHECK(count_prefix(items, "tree_build[") == 4);
  CHECK(count_prefix(items, "tree_accept[") == 4);
  CHECK(count_prefix(items, "tree_allocate[") == 4);
  CHECK(count_prefix(items, "kv_compact[") == 12);
  CHECK(count_prefix(items, "sample_tokens[") == 2);
  CHECK(items.size() == size_t(96 * kv + 26));

  std::set<std::string> labels;
  for (const auto& item : items) {
    INFO(item.label);
    CHECK(labels.insert(item.label).second);
    CHECK(static_cast<bool>(item.make));
  }
  CHECK(has_label(items, "verify_attention[mla576/512,W=64,page=64,bf16]"));
  CHECK(has_label(items, "verify_attention[gqa128,W=32,page=16,f16]"));
  CHECK(has_label(items, "verify_attention[gqa256,W=128,page=1,bf16]"));
  CHECK(has_label(items, "verify_attention[gqa64,W=16,page=64,f16]"));
  CHECK(has_label(items, "verify_attention[gqa64,W=16,page=64,f16,kv=e4m3]"));
}

TEST_CASE("grid: KV dtypes - as_q and e4m3, each listed alone or together") {
  GridOptions options;
  options.heads = {"gqa64"};
  options.widths = {16};
  options.page_sizes = {16};
  options.dtypes = {KDTREE_DTYPE_BF16};
  options.tree_ops = false;
  options.kv_dtypes = {KDTREE_KV_DTYPE_AS_Q};
  CHECK(enumerate_grid(options, kSm120).size() == 1);
  options.kv_dtypes = {KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3};
  const auto items = enumerate_grid(options, kSm120);
  CHECK(items.size() == 2);
  CHECK(has_label(items, "verify_attention[gqa64,W=16,page=16,bf16,kv=e4m3]"));
  options.kv_dtypes.clear();
  kdtree_status status = KDTREE_OK;
  const std::string message = grid_error(options, &status);
  CHECK(status == KDTREE_ERROR_INVALID_ARGUMENT);
  CHECK(message.find("kv_dtypes") != std::string::npos);
}

TEST_CASE("grid: every item renders the source its label names") {
  GridOptions options;
  options.heads = {"mla576/512", "gqa128"};
  options.widths = {16, 128};
  options.page_sizes = {1, 64};
  for (const auto& arch : {kdtree::codegen::arch_from_sm(120), kdtree::codegen::arch_from_sm(90)}) {
    for (const auto& item : enumerate_grid(options, arch)) {
      INFO(item.label, " ", arch.name());
      const kdtree::codegen::KernelSource source = item.make();
      CHECK(source.label == item.label);
      CHECK(item.label.rfind(source.op + "[", 0) == 0);
      CHECK(!source.source.empty());
      CHECK(!source.entry_points.empty());
      CHECK(source.file_stem.find_first_of("/ \t\n") == std::string::npos);
    }
  }
}

TEST_CASE("grid: options select the kernels") {
  GridOptions options;
  options.heads = {"gqa64"};
  options.widths = {32};
  options.page_sizes = {16};
  options.dtypes = {KDTREE_DTYPE_F16};
  options.kv_dtypes = {KDTREE_KV_DTYPE_AS_Q};
  options.tree_ops = false;
  auto items = enumerate_grid(options, kSm120);
  REQUIRE(items.size() == 1);
  CHECK(items[0].label == "verify_attention[gqa64,W=32,page=16,f16]");

  options.tree_ops = true;
  options.attention = false;
  items = enumerate_grid(options, kSm120);
  CHECK(count_prefix(items, "verify_attention[") == 0);
  CHECK(count_prefix(items, "tree_build[") == 1);
  CHECK(count_prefix(items, "tree_accept[") == 1);
  CHECK(count_prefix(items, "tree_allocate[") == 1);
  CHECK(count_prefix(items, "kv_compact[") == 1);
  CHECK(count_prefix(items, "sample_tokens[") == 2);

  // Repeated values do not repeat kernels.
  options.attention = true;
  options.widths = {32, 32};
  options.page_sizes = {16, 16};
  options.dtypes = {KDTREE_DTYPE_F16, KDTREE_DTYPE_F16};
  CHECK(enumerate_grid(options, kSm120).size() == 1 + 1 + 1 + 1 + 1 + 2);
}

TEST_CASE("grid: unsupported values throw naming the supported ones") {
  kdtree_status status = KDTREE_OK;
  SUBCASE("head") {
    GridOptions options;
    options.heads = {"gqa96"};
    const std::string message = grid_error(options, &status);
    INFO(message);
    CHECK(status == KDTREE_ERROR_UNSUPPORTED);
    CHECK(message.find("gqa96") != std::string::npos);
    CHECK(message.find("mla576/512") != std::string::npos);
    CHECK(message.find("gqa128") != std::string::npos);
  }
  SUBCASE("width") {
    GridOptions options;
    options.widths = {48};
    const std::string message = grid_error(options, &status);
    INFO(message);
    CHECK(status == KDTREE_ERROR_UNSUPPORTED);
    CHECK(message.find("48") != std::string::npos);
    CHECK(message.find("128") != std::string::npos);
  }
  SUBCASE("width of the tree operations alone") {
    GridOptions options;
    options.attention = false;
    options.widths = {48};
    const std::string message = grid_error(options, &status);
    INFO(message);
    CHECK(status == KDTREE_ERROR_UNSUPPORTED);
    CHECK(message.find("48") != std::string::npos);
    CHECK(message.find("128") != std::string::npos);
  }
  SUBCASE("page") {
    GridOptions options;
    options.page_sizes = {8};
    const std::string message = grid_error(options, &status);
    INFO(message);
    CHECK(status == KDTREE_ERROR_UNSUPPORTED);
    CHECK(message.find("64") != std::string::npos);
  }
  SUBCASE("dtype f32 is for sampling logits only") {
    GridOptions options;
    options.dtypes = {KDTREE_DTYPE_F32};
    const std::string message = grid_error(options, &status);
    INFO(message);
    CHECK(status == KDTREE_ERROR_UNSUPPORTED);
    CHECK(message.find("bf16") != std::string::npos);
  }
  SUBCASE("dtype name") {
    try {
      kdtree::codegen::parse_dtype("fp8");
      FAIL("parse_dtype accepted fp8");
    } catch (const kdtree::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("bf16") != std::string::npos);
    }
  }
  SUBCASE("empty option") {
    GridOptions options;
    options.widths.clear();
    const std::string message = grid_error(options, &status);
    CHECK(status == KDTREE_ERROR_INVALID_ARGUMENT);
    CHECK(message.find("widths") != std::string::npos);
  }
}
