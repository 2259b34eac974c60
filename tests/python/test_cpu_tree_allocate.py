"""CPU: kdtree.tree_allocate's argument checks (each error names the argument), its fake implementation (also
traced with symbolic shapes), its
launch path down to the C call (the C library replaced by a recorder, as test_cpu_launch_path.py does), and the
torch backend's tree_allocate against kdtree.integrations.allocate."""

import contextlib

import pytest
import torch

import kdtree
from kdtree import _checks, _launch, _lib, _plan_cache, _tree_allocate
from kdtree.integrations import torch_ops
from kdtree.integrations.allocate import URGENCY, allocate, allocate_round, behind


def _scores(B, W, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = -torch.rand(B, W, generator=g).mul(2).round().div(2).cumsum(1)  # ties within and across requests
    s[:, 0] = 0.0
    return s


def _args(B=4, W=32, **kw):
    a = dict(scores=_scores(B, W), total=3 * B, cap=W - 1, active=torch.ones(B, dtype=torch.bool),
             remaining=torch.arange(B, dtype=torch.int32) * 10, urgency=8.0)
    a.update(kw)
    return a


def _call(a):
    a = dict(a)
    return kdtree.tree_allocate(a.pop("scores"), **a)


CASES = [
    ("scores dtype", _args(scores=_scores(4, 32).double()), TypeError, r"^scores: expected dtype float32, got float64"),
    ("scores 1-d", _args(scores=_scores(4, 32)[0]), ValueError, r"^scores: expected 2 dimensions"),
    ("scores strided", _args(scores=_scores(32, 4).t()), ValueError, r"^scores: expected a contiguous"),
    ("width 20", _args(scores=_scores(4, 20), cap=5), ValueError, r"max_tree_nodes\).*20 is not a tree width"),
    ("batch 2049", _args(scores=_scores(2049, 16), cap=3, total=0, active=None, remaining=None), ValueError,
     r"^scores: expected 1\.\.2048 requests"),
    ("cap 0", _args(cap=0), ValueError, r"^cap: expected 1\.\.31"),
    ("cap W", _args(cap=32), ValueError, r"^cap: expected 1\.\.31"),
    ("cap float", _args(cap=3.0), TypeError, r"^cap: expected an int"),
    ("total negative", _args(total=-1), ValueError, r"^total: expected 0\.\.124 \(batch 4 x cap 31\)"),
    ("total past B x cap", _args(total=125), ValueError, r"^total: expected 0\.\.124"),
    ("active dtype", _args(active=torch.ones(4, dtype=torch.uint8)), TypeError, r"^active: expected dtype bool"),
    ("active shape", _args(active=torch.ones(5, dtype=torch.bool)), ValueError, r"^active: expected shape \[4\]"),
    ("remaining dtype", _args(remaining=torch.ones(4, dtype=torch.int64)), TypeError, r"^remaining: expected dtype int32"),
    ("urgency negative", _args(urgency=-1.0), ValueError, r"^urgency: expected a finite value >= 0"),
    ("urgency NaN", _args(urgency=float("nan")), ValueError, r"^urgency: expected a finite value >= 0"),
    ("urgency past float32", _args(urgency=1e39), ValueError, r"^urgency: expected a finite value >= 0"),
    ("urgency a string", _args(urgency="8"), TypeError, r"^urgency: expected a float"),
    ("scores a list", _args(scores=[[0.0]]), TypeError, r"^scores: expected a torch\.Tensor, got list"),
    ("cpu tensors", _args(), ValueError, r"^scores: expected a CUDA tensor"),
]


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tree_allocate_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(args)


@pytest.mark.parametrize("optional", [False, True], ids=["bare", "active+remaining"])
def test_tree_allocate_fake_shapes_on_meta(optional):
    B, W, total = 6, 64, 40
    s = torch.empty(B, W, device="meta")
    extra = (torch.empty(B, dtype=torch.bool, device="meta"), torch.empty(B, dtype=torch.int32, device="meta")) \
        if optional else (None, None)
    counts, indptr, req, node = torch.ops.kdtree.tree_allocate(s, total, 63, *extra, 8.0)
    assert [tuple(t.shape) for t in (counts, indptr, req, node)] == [(B,), (B + 1,), (B + total,), (B + total,)]
    assert [t.dtype for t in (counts, indptr, req, node)] == [torch.int32, torch.int32, torch.int64, torch.int64]
    with pytest.raises(ValueError, match=r"^total: expected 0\.\.378"):
        torch.ops.kdtree.tree_allocate(s, 379, 63)


def test_tree_allocate_fake_traces_with_symbolic_shapes():
    # What torch.compile(dynamic=True) does: the batch becomes a SymInt in the checks and the output sizes.
    from torch.fx.experimental.proxy_tensor import make_fx
    a = _args(B=5, W=32)
    fn = lambda s, act, rem: torch.ops.kdtree.tree_allocate(s, 9, 31, act, rem, 8.0)
    gm = make_fx(fn, tracing_mode="symbolic")(a["scores"], a["active"], a["remaining"])
    assert any(n.op == "call_function" and n.target == torch.ops.kdtree.tree_allocate.default for n in gm.graph.nodes)


@pytest.fixture
def recorder(monkeypatch):
    calls = []

    class Rec:
        def tree_allocate(self, rt, ref):
            s = ref._obj
            calls.append({f: getattr(s, f) for f, _ in s._fields_})
            return 0

    monkeypatch.setattr(_lib, "api", Rec())
    monkeypatch.setattr(_checks, "ACCEPT_CPU", True)
    monkeypatch.setattr(_launch, "_get_device", lambda: -1)
    monkeypatch.setattr(_launch, "runtime", lambda index: 0x1234)
    monkeypatch.setattr(_launch, "current_stream", lambda index: 0x5151)
    monkeypatch.setattr(_launch, "device_guard", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_tree_allocate, "_cache", _plan_cache.PlanCache())
    monkeypatch.setattr(_tree_allocate, "_launches", _launch.Launches(_tree_allocate._make_launch))
    return calls


@pytest.mark.parametrize("optional", [False, True], ids=["bare", "active+remaining"])
def test_tree_allocate_launch(recorder, optional):
    a = _args(B=5, W=64, total=17, cap=40, urgency=2.5)
    if not optional:
        a["active"] = a["remaining"] = None
    for _ in range(2):  # the second call takes the plan cache's entry
        counts, indptr, req, node = _call(a)
        f = recorder[-1]
        assert (f["batch_size"], f["max_tree_nodes"], f["cap"], f["total"]) == (5, 64, 40, 17)
        assert f["urgency"] == 2.5 and f["stream"] == 0x5151 and f["error_flags"] is None
        assert f["scores"] == a["scores"].data_ptr()
        assert f["active"] == (a["active"].data_ptr() if optional else None)
        assert f["remaining"] == (a["remaining"].data_ptr() if optional else None)
        assert (f["node_counts"], f["node_indptr"], f["row_req"], f["row_node"]) == tuple(
            t.data_ptr() for t in (counts, indptr, req, node))
        assert [tuple(t.shape) for t in (counts, indptr, req, node)] == [(5,), (6,), (22,), (22,)]
    a["total"] = 18  # a scalar that changes the plan
    _call(a)
    assert recorder[-1]["total"] == 18 and len(recorder) == 3


@pytest.mark.parametrize("weighted", [False, True])
def test_torch_backend_tree_allocate_is_allocate(weighted):
    B, W, cap, total = 7, 32, 20, 60
    s = _scores(B, W, seed=5)
    active = torch.tensor([True, True, False, True, True, True, False])
    remaining = torch.tensor([5, 120, 0, 64, 64, 3, -1], dtype=torch.int32)
    got = torch_ops.tree_allocate(s, total=total, cap=cap, active=active,
                                  remaining=remaining if weighted else None, urgency=URGENCY)
    want = allocate(s, active, total, cap, behind(remaining) if weighted else None)
    for g, w in zip(got, (want.counts, want.indptr, want.row_req, want.row_node)):
        assert torch.equal(g, w)
    r = allocate_round(torch_ops, s, active, total, cap, remaining)
    assert torch.equal(r.counts, allocate(s, active, total, cap, behind(remaining)).counts) and r.ranking is None
    no_active = torch_ops.tree_allocate(s, total=total, cap=cap)
    assert torch.equal(no_active[0], allocate(s, torch.ones(B, dtype=torch.bool), total, cap).counts)


@pytest.mark.parametrize("args,exc,pattern", [c[1:] for c in CASES if c[0] not in ("cpu tensors", "scores a list")],
                         ids=[c[0] for c in CASES if c[0] not in ("cpu tensors", "scores a list")])
def test_a_cached_plan_never_takes_arguments_the_checks_reject(recorder, args, exc, pattern):
    """The plan cache (_plan_cache.py) matches tensors by torch's guards and scalars by value and type: after the
    valid neighbours of a bad case were planned and launched, the bad case is still refused, and not launched."""
    for base in (_args(), _args(active=None, remaining=None)):
        _call(base)
    launches = len(recorder)
    with pytest.raises(exc, match=pattern):
        _call(args)
    assert len(recorder) == launches
    with pytest.raises(TypeError, match=r"^total: expected an int"):
        _call(_args(total=12.0))  # equal to the cached 12, but a float
