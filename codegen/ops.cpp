#include "codegen/ops.hpp"

#include <set>

#include <fmt/format.h>

#include "base/error.hpp"
#include "codegen/kv_compact.hpp"
#include "codegen/sample_tokens.hpp"
#include "codegen/tree_accept.hpp"
#include "codegen/tree_allocate.hpp"
#include "codegen/tree_build.hpp"
#include "codegen/verify_attention.hpp"

namespace kdtree::codegen {
namespace {

// Appends unless an item with the same label is already there, so repeated
// option values (--widths 16,16) do not compile a kernel twice.
struct Items {
  std::vector<GridItem> items;
  std::set<std::string> seen;
  void add(std::string label, std::function<KernelSource()> make) {
    if (seen.insert(label).second) items.push_back(GridItem{std::move(label), std::move(make)});
  }
};

// Head counts are run-time values; any consistent pair passes validation.
VerifySpec verify_spec(const std::string& head, int width, int page, kdtree_dtype dtype, kdtree_kv_dtype kv_dtype) {
  kdtree_verify_spec c{};
  parse_head_name(head, &c.head_dim_qk, &c.head_dim_v);
  c.num_q_heads = 16;
  c.num_kv_heads = c.head_dim_qk == 576 ? 1 : 2;
  c.max_tree_nodes = width;
  c.page_size = page;
  c.dtype = dtype;
  c.kv_dtype = kv_dtype;
  const VerifySpec spec = validate_verify_spec(c);
  return spec;
}

std::vector<GridItem> verify_grid(const GridOptions& o, const Arch& arch) {
  Items out;
  for (const std::string& head : o.heads) {
    for (int width : o.widths) {
      for (int page : o.page_sizes) {
        for (kdtree_dtype dtype : o.dtypes) {
          for (kdtree_kv_dtype kv_dtype : o.kv_dtypes) {
            const VerifySpec spec = verify_spec(head, width, page, dtype, kv_dtype);
            out.add(spec.label(), [spec, arch] { return generate_verify_attention(spec, arch); });
          }
        }
      }
    }
  }
  return std::move(out.items);
}

KernelSource verify_point(const OpPoint& p, const Arch& arch) {
  return generate_verify_attention(verify_spec(p.head, p.width, p.page, p.dtype, p.kv_dtype), arch);
}

// The tree operations whose only axis is the tree width (tree_build, tree_accept, tree_allocate): their spec,
// grid and point, one template for the three.
template <typename Spec>
Spec width_spec(int width) {
  Spec spec{};
  spec.max_tree_nodes = width;
  validate(spec);
  return spec;
}

template <typename Spec, KernelSource (*Generate)(const Spec&, const Arch&)>
std::vector<GridItem> width_grid(const GridOptions& o, const Arch& arch) {
  Items out;
  for (int width : o.widths) {
    const Spec spec = width_spec<Spec>(width);
    out.add(spec.label(), [spec, arch] { return Generate(spec, arch); });
  }
  return std::move(out.items);
}

template <typename Spec, KernelSource (*Generate)(const Spec&, const Arch&)>
KernelSource width_point(const OpPoint& p, const Arch& arch) {
  return Generate(width_spec<Spec>(p.width), arch);
}

KvCompactSpec compact_spec(int width, int page) {
  KvCompactSpec spec{};
  spec.page_size = page;
  spec.max_tree_nodes = width;
  validate(spec);
  return spec;
}

std::vector<GridItem> compact_grid(const GridOptions& o, const Arch& arch) {
  Items out;
  for (int width : o.widths) {
    for (int page : o.page_sizes) {
      const KvCompactSpec spec = compact_spec(width, page);
      out.add(spec.label(), [spec, arch] { return generate_kv_compact(spec, arch); });
    }
  }
  return std::move(out.items);
}

KernelSource compact_point(const OpPoint& p, const Arch& arch) {
  return generate_kv_compact(compact_spec(p.width, p.page), arch);
}

SampleSpec sample_spec(kdtree_dtype logits) {
  SampleSpec spec{};
  spec.logits_dtype = logits;
  validate(spec);
  return spec;
}

// Sampling does not depend on the tree shape: one kernel per logits dtype.
std::vector<GridItem> sample_grid(const GridOptions&, const Arch& arch) {
  Items out;
  for (kdtree_dtype logits : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
    const SampleSpec spec = sample_spec(logits);
    out.add(spec.label(), [spec, arch] { return generate_sample_tokens(spec, arch); });
  }
  return std::move(out.items);
}

KernelSource sample_point(const OpPoint& p, const Arch& arch) {
  return generate_sample_tokens(sample_spec(p.dtype), arch);
}

}  // namespace

const std::vector<OpInfo>& operations() {
  static const std::vector<OpInfo> ops = {
      {"verify_attention", true, verify_grid, verify_point, {"--head", "--width", "--page", "--dtype", "--kv-dtype"}},
      {"tree_build",
       false,
       width_grid<TreeBuildSpec, generate_tree_build>,
       width_point<TreeBuildSpec, generate_tree_build>,
       {"--width"}},
      {"tree_accept",
       false,
       width_grid<TreeAcceptSpec, generate_tree_accept>,
       width_point<TreeAcceptSpec, generate_tree_accept>,
       {"--width"}},
      {"tree_allocate",
       false,
       width_grid<TreeAllocateSpec, generate_tree_allocate>,
       width_point<TreeAllocateSpec, generate_tree_allocate>,
       {"--width"}},
      {"sample_tokens", false, sample_grid, sample_point, {"--dtype"}},
      {"kv_compact", false, compact_grid, compact_point, {"--width", "--page"}},
  };
  return ops;
}

std::vector<std::string> operation_names() {
  std::vector<std::string> names;
  for (const OpInfo& op : operations()) names.emplace_back(op.name);
  return names;
}

const OpInfo& find_operation(const std::string& name) {
  for (const OpInfo& op : operations()) {
    if (name == op.name) return op;
  }
  fail(KDTREE_ERROR_UNSUPPORTED, fmt::format("unknown op '{}': use {}", name, fmt::join(operation_names(), ", ")));
}

}  // namespace kdtree::codegen
