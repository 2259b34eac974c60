"""CPU: the functions' shortcut before the checks, the plan cache (recently planned argument sets, matched
by torch's C++ tensor guards: _plan_cache.py), never accepts what each operation's check() rejects, and a
hit launches like a checked call. CPU tensors stand in for CUDA ones (_checks.ACCEPT_CPU) and the C
library is a recorder (test_cpu_launch_path)."""

import ctypes

import pytest
import torch

import kdtree
import shapes
import test_cpu_validation as cases
from kdtree import _kv_compact, _lib, _plan_cache, _sample_tokens, _tree_accept, _tree_build, _verify_attention
from test_cpu_launch_path import recorder  # noqa: F401 - the fixture

FN = {"verify_attention": kdtree.verify_attention, "tree_build": kdtree.tree_build,
      "tree_accept": kdtree.tree_accept, "sample_tokens": kdtree.sample_tokens, "kv_compact": kdtree.kv_compact}
CASES = {"verify_attention": cases.VERIFY_CASES, "tree_build": cases.TREE_BUILD_CASES,
         "tree_accept": cases.TREE_ACCEPT_CASES, "sample_tokens": cases.SAMPLE_CASES,
         "kv_compact": cases.KV_COMPACT_CASES}
# The valid argument sets the bad cases are derived from (at most _plan_cache.SIZE per operation).
BASES = {"verify_attention": [cases.V, cases.G], "tree_build": [cases.T], "tree_accept": [cases.A, cases.P],
         "sample_tokens": [cases.S], "kv_compact": [cases.K, cases.KG, cases.KS]}


def checked(op, a):
    """The operation's check() on argument dict `a`: its Plan."""
    if op == "verify_attention":
        return _verify_attention.check(a["q"], a["k_cache"], a.get("v_cache"), a["page_table"], a["kv_lens"],
                                       a["node_indptr"], a["tree_mask"], a["max_tree_nodes"], a.get("sm_scale"),
                                       a.get("max_kv_len"))
    if op == "tree_build":
        return _tree_build.check(*(a[k] for k in ("draft_tokens", "draft_logprobs", "root_tokens", "prefix_lens",
                                                  "budget", "max_tree_nodes")))
    if op == "tree_accept":
        return _tree_accept.check(a["tokens"], a["parents"], a["node_counts"], a["target_tokens"], a.get("node_indptr"))
    if op == "sample_tokens":
        return _sample_tokens.check(a["logits"], float(a.get("temperature", 0.0)), a.get("row_offsets"))
    k, stacked = _kv_compact._as_list("k_caches", a["k_caches"])
    v, _ = _kv_compact._as_list("v_caches", a.get("v_caches"))
    return _kv_compact.check(k, v, a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"],
                             a["accept_lens"], stacked)


CHECKED_FIRST = {"negative seed", "v mixed form", "k not a tensor"}  # by the function, before any plan
BAD = [(op, c) for op, cs in CASES.items() for c in cs if not c[0].startswith("cpu tensors")]


@pytest.mark.parametrize("op,case", BAD, ids=[f"{op}[{c[0]}]" for op, c in BAD])
def test_bad_arguments_are_rejected_before_any_launch(recorder, op, case):
    name, args, exc, pattern = case
    if name not in CHECKED_FIRST:
        with pytest.raises(exc, match=pattern):
            checked(op, dict(args))
    with pytest.raises(exc, match=pattern):
        cases._call(FN[op], args)
    assert recorder.calls == [] or op == "verify_attention"  # nothing launched (verify may size a workspace)


@pytest.mark.parametrize("op,case", BAD, ids=[f"{op}[{c[0]}]" for op, c in BAD])
def test_cached_plan_is_never_used_for_arguments_the_checks_reject(recorder, op, case):
    for base in BASES[op]:  # every valid neighbour of the bad case planned and cached
        cases._call(FN[op], base)
    if _plan_cache.ENABLED:
        assert len(_module(op)._cache) == len(BASES[op])
    launches = len(recorder.calls)
    _, args, exc, pattern = case
    with pytest.raises(exc, match=pattern):
        cases._call(FN[op], args)
    assert len(recorder.calls) == launches or op == "verify_attention"


def _module(op):
    return {"verify_attention": _verify_attention, "tree_build": _tree_build, "tree_accept": _tree_accept,
            "sample_tokens": _sample_tokens, "kv_compact": _kv_compact}[op]


GOOD = [
    ("verify_attention", "mla", shapes.verify_args()),
    ("verify_attention", "mla-3d-cache", dict(shapes.verify_args(), k_cache=torch.zeros(10, 16, 576, dtype=torch.bfloat16))),
    ("verify_attention", "gqa,f16", shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128, dtype=torch.float16)),
    ("verify_attention", "gqa,sm_scale,max_kv_len", dict(shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=64),
                                                         sm_scale=0.3, max_kv_len=17)),
    ("tree_build", "B=3", shapes.tree_build_args()),
    ("tree_accept", "padded", shapes.tree_accept_args()),
    ("tree_accept", "packed", shapes.tree_accept_args(packed=True)),
    ("sample_tokens", "f32", shapes.sample_args()),
    ("sample_tokens", "bf16,row-stride", dict(shapes.sample_args(), logits=torch.zeros(6, 128, dtype=torch.bfloat16)[:, :100])),
    ("sample_tokens", "row_offsets", dict(shapes.sample_args(), row_offsets=torch.zeros(6, dtype=torch.int64))),
    ("kv_compact", "mla-list", shapes.kv_compact_args()),
    ("kv_compact", "gqa-list", shapes.kv_compact_args(mla=False, row=(2, 64))),
    ("kv_compact", "stacked", shapes.kv_compact_args(stacked=True)),
    ("kv_compact", "gqa-stacked,f16", shapes.kv_compact_args(stacked=True, mla=False, row=(2, 64), dtype=torch.float16)),
]


@pytest.mark.parametrize("op,args", [(g[0], g[2]) for g in GOOD], ids=[f"{g[0]}[{g[1]}]" for g in GOOD])
def test_the_launch_uses_the_plan_check_makes(recorder, op, args):
    cases._call(FN[op], args)
    plan = checked(op, dict(args))
    assert plan.device == -1 and all(isinstance(getattr(plan, f), (int, float)) for f in plan._fields)
    if _plan_cache.ENABLED:
        (_, _, launch), = _module(op)._cache._entries
        assert launch.plan == plan


def _fresh(a):
    """Equal arguments in new tensors (new addresses)."""
    def f(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        if isinstance(x, list):
            return [f(t) for t in x]
        return x
    return {k: f(v) for k, v in a.items()}


STRUCTS = {"verify_attention": _lib.VerifyArgs, "tree_build": _lib.TreeBuildArgs, "tree_accept": _lib.TreeAcceptArgs,
           "sample_tokens": _lib.SampleArgs, "kv_compact": _lib.KvCompactArgs}


@pytest.mark.parametrize("op,args", [(g[0], g[2]) for g in GOOD], ids=[f"{g[0]}[{g[1]}]" for g in GOOD])
def test_a_cache_hit_launches_like_a_planned_call_with_the_new_addresses(recorder, monkeypatch, op, args):
    if not _plan_cache.ENABLED:
        pytest.skip(f"torch {torch.__version__} has no usable TensorGuards: the plan cache is off")
    cases._call(FN[op], args)
    first = recorder.calls[-1][1]
    module = _module(op)
    assert len(module._cache) == 1

    def no_checks(*a, **k):
        raise AssertionError("planned again: the cache missed")
    monkeypatch.setattr(module, "check", no_checks)
    fresh = _fresh(args)
    cases._call(FN[op], fresh)
    name, second = recorder.calls[-1]
    assert name == op
    for field, ctype in STRUCTS[op]._fields_:
        if ctype is ctypes.c_void_p:  # an address: each input's is the new tensor's
            if isinstance(fresh.get(field), torch.Tensor) and field not in ("k_caches", "v_caches"):  # tables
                assert second[field] == fresh[field].data_ptr(), field
        elif field == "spec":
            assert bytes(second[field]) == bytes(first[field])
        else:  # a size, dtype or scalar: as planned
            assert second[field] == first[field], field
    if op == "kv_compact":
        assert second["k_caches"] != first["k_caches"]  # the new caches' pointer table


VARIANTS = [  # (op, name, cached arguments, then arguments that differ in one fact, the field that shows it)
    ("verify_attention", "batch", shapes.verify_args(), shapes.verify_args(batch=3, nodes=(3, 5, 2)), "batch_size", 3),
    ("verify_attention", "max_kv_len", shapes.verify_args(), dict(shapes.verify_args(), max_kv_len=40), "max_kv_len", 40),
    ("verify_attention", "sm_scale", shapes.verify_args(), dict(shapes.verify_args(), sm_scale=0.25), "sm_scale", 0.25),
    ("verify_attention", "dtype", shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128),
     shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128, dtype=torch.float16), "spec.dtype", _lib.DTYPE_F16),
    ("tree_accept", "width", shapes.tree_accept_args(width=32), shapes.tree_accept_args(width=64), "max_tree_nodes", 64),
    ("tree_accept", "packed length", shapes.tree_accept_args(packed=True, total=20),
     shapes.tree_accept_args(packed=True, total=21), "total_nodes", 21),
    ("sample_tokens", "row stride", shapes.sample_args(vocab=100),
     dict(shapes.sample_args(), logits=torch.zeros(6, 128)[:, :100]), "row_stride", 128),
    ("sample_tokens", "dtype", shapes.sample_args(), shapes.sample_args(dtype=torch.bfloat16), "logits_dtype", _lib.DTYPE_BF16),
    ("tree_build", "budget", shapes.tree_build_args(budget=10), shapes.tree_build_args(budget=11), "budget", 11),
    ("kv_compact", "layers", shapes.kv_compact_args(layers=3), shapes.kv_compact_args(layers=4), "num_layers", 4),
    ("kv_compact", "row", shapes.kv_compact_args(mla=False, row=(2, 64)), shapes.kv_compact_args(mla=False, row=(4, 64)),
     "row_elems_k", 256),
]


@pytest.mark.parametrize("op,first,then,field,value", [v[:1] + v[2:] for v in VARIANTS],
                         ids=[f"{v[0]}[{v[1]}]" for v in VARIANTS])
def test_arguments_that_differ_from_a_cached_plan_are_planned_anew(recorder, op, first, then, field, value):
    cases._call(FN[op], first)
    cases._call(FN[op], then)
    got = recorder.calls[-1][1]
    for part in field.split("."):
        got = got[part] if isinstance(got, dict) else getattr(got, part)
    assert got == pytest.approx(value)


@pytest.mark.parametrize("op", list(BASES))
def test_a_cached_plan_is_not_used_on_another_device(recorder, op):
    base = BASES[op][0]
    cases._call(FN[op], base)
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else [t.to("meta") for t in v] if isinstance(v, list)
                else v) for k, v in base.items()}
    with pytest.raises(ValueError, match=r"expected a CUDA tensor, got one on meta"):
        cases._call(FN[op], meta)
    one = dict(base)
    name = {"verify_attention": "kv_lens", "tree_build": "prefix_lens", "tree_accept": "node_counts",
            "sample_tokens": "row_offsets", "kv_compact": "accept_lens"}[op]
    one[name] = torch.zeros(6, dtype=torch.int64, device="meta") if op == "sample_tokens" else one[name].to("meta")
    with pytest.raises(ValueError, match=rf"^{name}: expected a CUDA tensor, got one on meta"):
        cases._call(FN[op], one)


def test_plan_cache_matches_only_equal_tensors_and_scalars():
    if not _plan_cache.ENABLED:
        pytest.skip(f"torch {torch.__version__} has no usable TensorGuards: the plan cache is off")
    c = _plan_cache.PlanCache()
    a, b = torch.zeros(4, 8), torch.zeros(4, dtype=torch.int32)
    c.add(("s", 1), (a, b), "plan")
    assert c.find(("s", 1), (torch.ones(4, 8), torch.ones(4, dtype=torch.int32))) == "plan"  # other data, addresses
    assert c.find(("s", 1), (torch.zeros(4, 16)[:, :8], b)) is None  # stride
    assert c.find(("s", 1), (torch.zeros(8, 4).t(), b)) is None  # stride, same shape
    assert c.find(("s", 1), (torch.zeros(4, 9), b)) is None  # shape
    assert c.find(("s", 1), (a.double(), b)) is None  # dtype
    assert c.find(("s", 1), (a, b.to("meta"))) is None  # device
    assert c.find(("s", 1), (torch.nn.Parameter(a), b)) is None  # type
    assert c.find(("s", 1), (a, None)) is None  # not a tensor
    assert c.find(("s", 2), (a, b)) is None  # scalars
    assert c.find(("s", 1.5), (a, b)) is None
    for i in range(_plan_cache.SIZE):
        c.add(("s", 10 + i), (a, b), i)
    assert len(c) == _plan_cache.SIZE and c.find(("s", 1), (a, b)) is None  # the oldest went
    assert c.find(("s", 10), (a, b)) == 0


def test_without_tensor_guards_nothing_is_cached_and_calls_still_work(recorder, monkeypatch):
    monkeypatch.setattr(_plan_cache, "ENABLED", False)
    a = shapes.tree_accept_args()
    for _ in range(2):
        kdtree.tree_accept(a["tokens"], a["parents"], a["node_counts"], a["target_tokens"])
    assert len(_tree_accept._cache) == 0 and len(recorder.calls) == 2


def test_a_launch_on_a_device_that_is_not_current_switches_to_it(recorder, monkeypatch):
    from kdtree import _launch
    current = [7]
    entered = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            current.append(self.index)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(_launch, "_get_device", lambda: current[-1])
    monkeypatch.setattr(torch.cuda, "device", Device)
    a = shapes.tree_accept_args()
    kdtree.tree_accept(a["tokens"], a["parents"], a["node_counts"], a["target_tokens"])
    assert entered == [-1] and current == [7] and recorder.calls[-1][0] == "tree_accept"


def test_kv_compact_pointer_table_device_is_the_cuda_device():
    # The table of per-layer cache addresses lives on the caches' CUDA device (a GPU run found this
    # helper missing: no CPU test reached it).
    from kdtree import _kv_compact
    assert _kv_compact._device(0) == torch.device("cuda", 0)
    assert _kv_compact._device(1) is _kv_compact._device(1)
    assert _kv_compact._device(-1) == torch.device("cpu")
