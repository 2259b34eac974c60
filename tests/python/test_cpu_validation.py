"""CPU: bad arguments raise ValueError/TypeError naming the argument and what was expected, before any
device work. The arguments are CPU tensors, so arguments that pass every shape check end in the
'expected a CUDA tensor' error (which is itself checked)."""

import re

import pytest
import torch

import kdtree
import shapes


def _call(fn, args):
    args = dict(args)
    positional = {
        kdtree.verify_attention: ("q", "k_cache", "page_table", "kv_lens", "node_indptr", "tree_mask"),
        kdtree.tree_build: ("draft_tokens", "draft_logprobs", "root_tokens", "prefix_lens"),
        kdtree.tree_accept: ("tokens", "parents", "node_counts", "target_tokens"),
        kdtree.sample_tokens: ("logits",),
        kdtree.kv_compact: ("k_caches", "page_table", "kv_lens", "node_counts", "accepted_path", "accept_lens"),
    }[fn]
    pos = [args.pop(k) for k in positional]
    return fn(*pos, **args)


def _with(base, **changes):
    out = dict(base)
    out.update(changes)
    return out


V = shapes.verify_args()
G = shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128)
VERIFY_CASES = [
    ("q wrong dtype", _with(V, q=V["q"].float()), TypeError, r"^q: expected dtype bfloat16 or float16, got float32"),
    ("q 2-d", _with(V, q=V["q"][0]), ValueError, r"^q: expected 3 dimensions"),
    ("q strided", _with(V, q=V["q"].transpose(0, 1).contiguous().transpose(0, 1)), ValueError, r"^q: expected a contiguous"),
    ("k_cache dtype differs", _with(V, k_cache=V["k_cache"].half()), TypeError, r"^k_cache: expected dtype bfloat16 \(q's dtype\)"),
    ("mla k_cache head dim", _with(V, k_cache=V["k_cache"][..., :512].contiguous()), ValueError, r"^k_cache: expected shape \[\*, \*, 1, 576\]"),
    ("gqa without v_cache", _with(G, v_cache=None), ValueError, r"^v_cache: required for GQA"),
    ("mla with v_cache", _with(V, v_cache=V["k_cache"]), ValueError, r"^v_cache: MLA"),
    ("gqa head dim 96", shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=96), ValueError, r"head dim.*96 is not a head dim kdtree generates"),
    ("gqa v shape", _with(G, v_cache=G["v_cache"][:, :, :1].contiguous()), ValueError, r"^v_cache: expected shape"),
    ("gqa heads", shapes.verify_args(mla=False, heads=6, kv_heads=4, head_dim=64), ValueError, r"^q: 6 query heads is not a multiple"),
    ("page size 8", shapes.verify_args(page=8), ValueError, r"page size.*8 is not a page size kdtree generates"),
    ("width 48", _with(V, max_tree_nodes=48), ValueError, r"^max_tree_nodes: 48 is not a tree width"),
    ("page_table int64", _with(V, page_table=V["page_table"].long()), TypeError, r"^page_table: expected dtype int32"),
    ("kv_lens batch", _with(V, kv_lens=V["kv_lens"][:1]), ValueError, r"^kv_lens: expected shape \[2\], got \[1\]"),
    ("node_indptr size", _with(V, node_indptr=V["node_indptr"][:2]), ValueError, r"^node_indptr: expected shape \[3\]"),
    ("tree_mask words", _with(V, tree_mask=torch.zeros(8, 2, dtype=torch.int64)), ValueError, r"^tree_mask: expected shape \[8, 1\]"),
    ("tree_mask dtype", _with(V, tree_mask=V["tree_mask"].int()), TypeError, r"^tree_mask: expected dtype int64"),
    ("too many nodes", shapes.verify_args(nodes=(17, 16)), ValueError, r"^q: 33 tree nodes \(rows\) for 2 requests"),
    ("max_kv_len too big", _with(V, max_kv_len=65), ValueError, r"^max_kv_len: 65 exceeds"),
    ("sm_scale", _with(V, sm_scale=-1.0), ValueError, r"^sm_scale: expected a finite value > 0"),
    ("sm_scale float32 0", _with(V, sm_scale=1e-50), ValueError, r"^sm_scale: .* \(as float32, the C ABI's type: 0.0\)"),
    ("max_kv_len 0", _with(V, max_kv_len=0), ValueError, r"^max_kv_len: 0 is out of range \[1, 1073741824\]"),
    ("page_table no pages", _with(V, page_table=V["page_table"][:, :0]), ValueError, r"^page_table: expected at least one request and one page column"),
    ("gqa no kv heads", _with(G, k_cache=G["k_cache"][:, :, :0], v_cache=G["v_cache"][:, :, :0]), ValueError, r"^k_cache: expected at least one KV head"),
    ("width float", _with(V, max_tree_nodes=16.0), TypeError, r"^max_tree_nodes: expected an int, got float"),
    ("max_kv_len float", _with(V, max_kv_len=64.0), TypeError, r"^max_kv_len: expected an int, got float"),
    ("cpu tensors", V, ValueError, r"^q: expected a CUDA tensor, got one on cpu"),
]


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in VERIFY_CASES], ids=[c[0] for c in VERIFY_CASES])
def test_verify_attention_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(kdtree.verify_attention, args)


T = shapes.tree_build_args()
TREE_BUILD_CASES = [
    ("tokens dtype", _with(T, draft_tokens=T["draft_tokens"].long()), TypeError, r"^draft_tokens: expected dtype int32"),
    ("logprobs shape", _with(T, draft_logprobs=T["draft_logprobs"][:, :3].contiguous()), ValueError, r"^draft_logprobs: expected shape \[3, 4, 5\]"),
    ("logprobs dtype", _with(T, draft_logprobs=T["draft_logprobs"].half()), TypeError, r"^draft_logprobs: expected dtype float32"),
    ("root batch", _with(T, root_tokens=T["root_tokens"][:2]), ValueError, r"^root_tokens: expected shape \[3\]"),
    ("prefix batch", _with(T, prefix_lens=torch.zeros(4, dtype=torch.int32)), ValueError, r"^prefix_lens: expected shape \[3\]"),
    ("depth 17", shapes.tree_build_args(depth=17), ValueError, r"^draft_tokens: depth D = shape\[1\] = 17"),
    ("top_k 65", shapes.tree_build_args(top_k=65), ValueError, r"^draft_tokens: top-K = shape\[2\] = 65"),
    ("budget 16 of 16", _with(T, budget=16), ValueError, r"^budget: 16 is outside \[1, max_tree_nodes - 1 = 15\]"),
    ("budget 0", _with(T, budget=0), ValueError, r"^budget: 0"),
    ("width 100", _with(T, max_tree_nodes=100), ValueError, r"^max_tree_nodes: 100 is not a tree width"),
    ("budget float", _with(T, budget=10.0), TypeError, r"^budget: expected an int, got float"),
    ("cpu tensors", T, ValueError, r"^draft_tokens: expected a CUDA tensor"),
]


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in TREE_BUILD_CASES], ids=[c[0] for c in TREE_BUILD_CASES])
def test_tree_build_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(kdtree.tree_build, args)


A = shapes.tree_accept_args()
P = shapes.tree_accept_args(packed=True)
TREE_ACCEPT_CASES = [
    ("width 20", shapes.tree_accept_args(width=20), ValueError, r"max_tree_nodes\).*20 is not a tree width"),
    ("parents shape", _with(A, parents=A["parents"][:, :16].contiguous()), ValueError, r"^parents: expected shape \[3, 32\]"),
    ("node_counts dtype", _with(A, node_counts=A["node_counts"].float()), TypeError, r"^node_counts: expected dtype int32"),
    ("targets packed without indptr", _with(A, target_tokens=P["target_tokens"]), ValueError, r"^target_tokens: expected the padded layout"),
    ("targets padded with indptr", _with(P, target_tokens=A["target_tokens"]), ValueError, r"^target_tokens: with node_indptr"),
    ("indptr size", _with(P, node_indptr=P["node_indptr"][:3]), ValueError, r"^node_indptr: expected shape \[4\]"),
    ("packed too few", _with(P, target_tokens=torch.zeros(2, dtype=torch.int32)), ValueError, r"^target_tokens: 2 packed nodes for 3 requests"),
    ("packed too many", _with(P, target_tokens=torch.zeros(97, dtype=torch.int32)), ValueError, r"^target_tokens: 97 packed nodes"),
    ("cpu tensors", A, ValueError, r"^tokens: expected a CUDA tensor"),
]


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in TREE_ACCEPT_CASES], ids=[c[0] for c in TREE_ACCEPT_CASES])
def test_tree_accept_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(kdtree.tree_accept, args)


S = shapes.sample_args()
SAMPLE_CASES = [
    ("f16 logits", _with(S, logits=S["logits"].half()), TypeError, r"^logits: expected dtype bfloat16 or float32, got float16"),
    ("1-d logits", _with(S, logits=S["logits"][0]), ValueError, r"^logits: expected 2 dimensions"),
    ("column-major", _with(S, logits=S["logits"].t().contiguous().t()), ValueError, r"^logits: expected unit stride"),
    ("empty vocab", _with(S, logits=torch.zeros(3, 0)), ValueError, r"^logits: expected at least one column"),
    ("nan temperature", _with(S, temperature=float("nan")), ValueError, r"^temperature: expected a finite value"),
    ("temperature float32 inf", _with(S, temperature=1e39), ValueError, r"^temperature: expected a finite value within float32's range"),
    ("negative seed", _with(S, seed=-1), ValueError, r"^seed: expected an integer in \[0, 2\*\*64\)"),
    ("row_offsets dtype", _with(S, row_offsets=torch.zeros(6, dtype=torch.int32)), TypeError, r"^row_offsets: expected dtype int64"),
    ("row_offsets rows", _with(S, row_offsets=torch.zeros(5, dtype=torch.int64)), ValueError, r"^row_offsets: expected shape \[6\]"),
    ("cpu tensors", S, ValueError, r"^logits: expected a CUDA tensor"),
]


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in SAMPLE_CASES], ids=[c[0] for c in SAMPLE_CASES])
def test_sample_tokens_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(kdtree.sample_tokens, args)


@pytest.mark.skipif(not hasattr(torch, "uint64"), reason="this torch has no uint64 dtype")
def test_verify_attention_takes_tree_mask_as_uint64_too():  # kdtree.h's type
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):  # got past the dtype check
        _call(kdtree.verify_attention, _with(V, tree_mask=V["tree_mask"].to(torch.uint64)))


def test_sample_tokens_accepts_a_row_stride_wider_than_the_vocabulary():
    wide = torch.zeros(4, 128)[:, :100]
    with pytest.raises(ValueError, match=r"^logits: expected a CUDA tensor"):  # got past the stride check
        kdtree.sample_tokens(wide)


K = shapes.kv_compact_args()
KG = shapes.kv_compact_args(mla=False, row=(2, 64))
KS = shapes.kv_compact_args(stacked=True)
KV_COMPACT_CASES = [
    ("empty list", _with(K, k_caches=[]), ValueError, r"^k_caches: expected at least one layer"),
    ("layer shape differs", _with(K, k_caches=K["k_caches"][:2] + [torch.zeros(8, 16, 1, 512, dtype=torch.bfloat16)]), ValueError, r"^k_caches\[2\]: shape \[8, 16, 1, 512\] bfloat16 on cpu differs"),
    ("layer dtype", _with(K, k_caches=[t.float() for t in K["k_caches"]]), TypeError, r"^k_caches\[0\]: expected dtype bfloat16 or float16"),
    ("page size 12", shapes.kv_compact_args(page=12), ValueError, r"page size.*12 is not a page size"),
    ("row not /8", shapes.kv_compact_args(row=(1, 10)), ValueError, r"^k_caches: a token row holds 10 elements"),
    ("v layers", _with(KG, v_caches=KG["v_caches"][:2]), ValueError, r"^v_caches: 2 layers"),
    ("v mixed form", _with(KS, v_caches=K["k_caches"]), TypeError, r"^v_caches: pass the same form"),
    ("stacked 3-d", _with(KS, k_caches=torch.zeros(8, 16, 576, dtype=torch.bfloat16)), ValueError, r"^k_caches: expected \[num_layers, num_pages, page_size, \.\.\.\]"),
    ("k not a tensor", _with(K, k_caches="cache"), TypeError, r"^k_caches: expected a list"),
    ("kv_lens batch", _with(K, kv_lens=torch.zeros(3, dtype=torch.int32)), ValueError, r"^kv_lens: expected shape \[2\]"),
    ("accept_lens dtype", _with(K, accept_lens=K["accept_lens"].long()), TypeError, r"^accept_lens: expected dtype int32"),
    ("path width", _with(K, accepted_path=torch.zeros(2, 24, dtype=torch.int32)), ValueError, r"max_tree_nodes\).*24 is not a tree width"),
    ("path batch", _with(K, accepted_path=torch.zeros(3, 16, dtype=torch.int32)), ValueError, r"^accepted_path: expected shape \[2, W\]"),
    ("cpu tensors", K, ValueError, r"^k_caches: expected a CUDA tensor"),
    ("cpu tensors stacked", KS, ValueError, r"^k_caches: expected a CUDA tensor"),
]


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in KV_COMPACT_CASES], ids=[c[0] for c in KV_COMPACT_CASES])
def test_kv_compact_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(kdtree.kv_compact, args)


def test_the_operators_validate_like_the_functions():
    # torch.ops.kdtree.* on CPU tensors reaches the same checks (nothing crashes in the dispatcher).
    a = _with(V, q=V["q"].float())
    with pytest.raises(TypeError, match=r"^q: expected dtype"):
        torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], None, a["page_table"], a["kv_lens"],
                                          a["node_indptr"], a["tree_mask"], 16)


NOT_TENSORS = [
    (kdtree.tree_build, _with(T, draft_tokens=[1, 2]), r"^draft_tokens: expected a torch\.Tensor, got list"),
    (kdtree.tree_build, _with(T, prefix_lens=[1, 2]), r"^prefix_lens: expected a torch\.Tensor, got list"),
    (kdtree.verify_attention, _with(V, q=[1, 2]), r"^q: expected a torch\.Tensor, got list"),
    (kdtree.verify_attention, _with(V, tree_mask=None), r"^tree_mask: expected a torch\.Tensor, got NoneType"),
    (kdtree.tree_accept, _with(A, tokens=(1, 2)), r"^tokens: expected a torch\.Tensor, got tuple"),
    (kdtree.sample_tokens, _with(S, logits=[[0.5]]), r"^logits: expected a torch\.Tensor, got list"),
    (kdtree.kv_compact, _with(K, page_table=[[0]]), r"^page_table: expected a torch\.Tensor, got list"),
]


@pytest.mark.parametrize("fn,args,pattern", NOT_TENSORS, ids=[f"{f.__name__}[{p.split(':')[0][1:]}]" for f, _, p in NOT_TENSORS])
def test_a_non_tensor_is_a_type_error_naming_the_argument(fn, args, pattern):
    # Not torch's dispatcher error (a RuntimeError naming no argument): the functions check first.
    with pytest.raises(TypeError, match=pattern):
        _call(fn, args)
