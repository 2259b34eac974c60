"""CPU: the fake implementations (what torch.compile traces with) give the outputs' shapes and dtypes,
on meta tensors through torch.ops.kdtree.* and on fake CUDA tensors through the plain functions."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import kdtree
import shapes


def _sig(t):
    return tuple(t.shape), t.dtype


@pytest.mark.parametrize("mla,heads,kv_heads,head_dim,width,lse", [
    (True, 16, 1, 576, 64, True), (True, 128, 1, 576, 128, False), (False, 32, 8, 128, 16, True),
    (False, 8, 8, 64, 32, False), (False, 4, 1, 256, 128, True)],
    ids=["mla576/512,W=64,lse", "mla576/512,W=128", "gqa128,W=16,lse", "gqa64,W=32", "gqa256,W=128,lse"])
def test_verify_attention_fake_shapes_on_meta(mla, heads, kv_heads, head_dim, width, lse):
    a = shapes.verify_args("meta", mla=mla, heads=heads, kv_heads=kv_heads, head_dim=head_dim, width=width,
                           dtype=torch.float16)
    out, l = torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["kv_lens"],
                                               a["node_indptr"], a["tree_mask"], width, None, None, lse)
    dv = 512 if mla else head_dim
    assert _sig(out) == ((8, heads, dv), torch.float16)
    assert _sig(l) == (((8, heads) if lse else (0,)), torch.float32)
    assert out.device.type == "meta"


def test_verify_attention_fake_rejects_bad_shapes_too():
    a = shapes.verify_args("meta")
    with pytest.raises(ValueError, match=r"^kv_lens: expected shape \[2\]"):
        torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], None, a["page_table"], a["kv_lens"][:1],
                                          a["node_indptr"], a["tree_mask"], 16)


@pytest.mark.parametrize("width", kdtree.supported_shapes().widths, ids=lambda w: f"W={w}")
def test_tree_build_fake_shapes_on_meta(width):
    a = shapes.tree_build_args("meta", batch=5, width=width, budget=width - 1)
    r = torch.ops.kdtree.tree_build(*a.values())
    assert len(r) == 9
    r = kdtree.TreeBuildResult(*r)
    for name in ("tokens", "parents", "depths", "positions", "first_child", "next_sibling"):
        assert _sig(getattr(r, name)) == ((5, width), torch.int32), name
    assert _sig(r.tree_mask) == ((5, width, (width + 63) // 64), torch.int64)
    assert _sig(r.node_counts) == ((5,), torch.int32)
    assert _sig(r.scores) == ((5, width), torch.float32)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_tree_accept_fake_shapes_on_meta(packed):
    a = shapes.tree_accept_args("meta", batch=4, width=64, packed=packed)
    path, lens, bonus = torch.ops.kdtree.tree_accept(*a.values())
    assert _sig(path) == ((4, 64), torch.int32)
    assert _sig(lens) == ((4,), torch.int32) and _sig(bonus) == ((4,), torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_sample_tokens_fake_shapes_on_meta(dtype):
    a = shapes.sample_args("meta", rows=7, vocab=1000, dtype=dtype)
    assert _sig(torch.ops.kdtree.sample_tokens(*a.values())) == ((7,), torch.int32)


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "stacked"])
def test_kv_compact_fake_on_meta_returns_nothing(stacked):
    a = shapes.kv_compact_args("meta", mla=False, row=(4, 64), stacked=stacked)
    k = [a["k_caches"]] if stacked else a["k_caches"]
    v = [a["v_caches"]] if stacked else a["v_caches"]
    assert torch.ops.kdtree.kv_compact(k, v, a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"],
                                       a["accept_lens"], stacked) is None


def _fake_cuda_or_skip():
    try:
        with FakeTensorMode():
            torch.empty(1, device="cuda")
    except Exception as e:  # a torch build that cannot describe CUDA tensors without CUDA
        pytest.skip(f"this torch build cannot make fake CUDA tensors: {e}")


def test_plain_functions_on_fake_cuda_tensors():
    _fake_cuda_or_skip()
    with FakeTensorMode():
        a = shapes.verify_args("cuda", mla=False, heads=8, kv_heads=2, head_dim=128)
        out = kdtree.verify_attention(a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"],
                                      a["tree_mask"], max_tree_nodes=16, v_cache=a["v_cache"])
        assert _sig(out) == ((8, 8, 128), torch.bfloat16) and out.device.type == "cuda"
        r = kdtree.tree_build(**shapes.tree_build_args("cuda"))
        assert isinstance(r, kdtree.TreeBuildResult) and _sig(r.tokens) == ((3, 16), torch.int32)
        path, lens, bonus = kdtree.tree_accept(*list(shapes.tree_accept_args("cuda").values())[:4])
        assert _sig(path) == ((3, 32), torch.int32)
        s = shapes.sample_args("cuda", dtype=torch.bfloat16)
        assert _sig(kdtree.sample_tokens(s["logits"], temperature=0.7, seed=2**64 - 1)) == ((6,), torch.int32)


def test_make_fx_traces_verify_attention_as_one_operator():
    def step(q, k, pt, lens, indptr, mask):
        out, lse = kdtree.verify_attention(q, k, pt, lens, indptr, mask, max_tree_nodes=16, return_lse=True)
        return out.float().sum(-1) + lse

    _fake_cuda_or_skip()
    with FakeTensorMode():
        a = shapes.verify_args("cuda")
        gm = make_fx(step)(a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"], a["tree_mask"])
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.kdtree.verify_attention.default in targets, targets


@pytest.mark.parametrize("op", ["verify_attention[mla]", "verify_attention[gqa]", "tree_build", "tree_accept",
                                "sample_tokens", "kv_compact"])
def test_fake_implementation_traces_with_symbolic_shapes(op):
    # What torch.compile(dynamic=True) and opcheck's dynamic test do: sizes become SymInts in the checks.
    if op.startswith("verify_attention"):
        a = shapes.verify_args(mla=op.endswith("[mla]"), heads=8, kv_heads=2, head_dim=128)
        inputs = (a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["kv_lens"], a["node_indptr"], a["tree_mask"])
        fn = lambda q, k, v, pt, kl, ip, tm: torch.ops.kdtree.verify_attention(q, k, v, pt, kl, ip, tm, 16, None, None, True)
    elif op == "tree_build":
        inputs = tuple(shapes.tree_build_args().values())[:4]
        fn = lambda *x: torch.ops.kdtree.tree_build(*x, 10, 16)
    elif op == "tree_accept":
        inputs = tuple(shapes.tree_accept_args().values())[:4]
        fn = lambda *x: torch.ops.kdtree.tree_accept(*x, None)
    elif op == "sample_tokens":
        inputs = (shapes.sample_args()["logits"],)
        fn = lambda x: torch.ops.kdtree.sample_tokens(x, 0.5, 3, None)
    else:
        k = shapes.kv_compact_args(mla=False, row=(2, 64))
        inputs = (k["k_caches"], k["v_caches"], k["page_table"], k["kv_lens"], k["node_counts"], k["accepted_path"],
                  k["accept_lens"])
        fn = lambda kc, vc, *r: torch.ops.kdtree.kv_compact(kc, vc, *r, False)
    gm = make_fx(fn, tracing_mode="symbolic")(*inputs)
    name = op.split("[")[0]
    assert any(n.op == "call_function" and n.target == getattr(torch.ops.kdtree, name).default for n in gm.graph.nodes)


def test_fake_implementations_reject_tensors_on_two_devices():
    # The real ops refuse them; a traced graph must not accept what the call then refuses.
    _fake_cuda_or_skip()
    with FakeTensorMode():
        a = shapes.verify_args("cuda")
        with pytest.raises(ValueError, match=r"^page_table: on cpu, but q is on cuda:0; all tensors must be on one"):
            torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], None, a["page_table"].cpu(), a["kv_lens"],
                                              a["node_indptr"], a["tree_mask"], 16)
