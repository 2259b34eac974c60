"""CPU: the launch path of every function down to the C call, with the C library replaced by a recorder
and the device by the CPU: checks that each ctypes argument struct carries the tensors' addresses, the
sizes derived from their shapes, torch's stream, and the workspace / pointer tables the package manages."""

import contextlib
import math
import re
import ctypes

import pytest
import torch

import kdtree
import shapes
from kdtree import (_checks, _kv_compact, _launch, _lib, _plan_cache, _sample_tokens, _tree_accept, _tree_build,
                    _verify_attention)

OPS = (_verify_attention, _tree_build, _tree_accept, _sample_tokens, _kv_compact)

STREAM = 0x5151
RUNTIME = 0x1234
WORKSPACE = 3000


class Recorder:
    def __init__(self):
        self.calls = []

    def _record(self, name, rt, ref):
        assert rt == RUNTIME
        s = ref._obj
        self.calls.append((name, {f: getattr(s, f) for f, _ in s._fields_}))
        return 0

    def verify_workspace_size(self, rt, spec, batch, total, max_kv_len, out):
        self.calls.append(("verify_workspace_size", dict(batch=batch, total=total, max_kv_len=max_kv_len,
                                                         head_dim_qk=spec._obj.head_dim_qk)))
        out._obj.value = WORKSPACE
        return 0

    def __getattr__(self, name):
        return lambda rt, ref: self._record(name, rt, ref)


class NoEvent:
    def record(self):
        pass

    def query(self):
        return True


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(_lib, "api", rec)
    monkeypatch.setattr(_checks, "ACCEPT_CPU", True)  # CPU tensors stand for the device's
    monkeypatch.setattr(_launch, "_get_device", lambda: -1)  # the CPU tensors' get_device(): already current
    monkeypatch.setattr(_launch, "runtime", lambda index: RUNTIME)
    monkeypatch.setattr(_launch, "current_stream", lambda index: STREAM)
    monkeypatch.setattr(_launch, "device_guard", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_launch, "capturing", lambda: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    monkeypatch.setattr(_launch, "_workspaces", {})
    monkeypatch.setattr(_kv_compact, "_tables", {})
    for op in OPS:
        monkeypatch.setattr(op, "_cache", _plan_cache.PlanCache())
        monkeypatch.setattr(op, "_launches", _launch.Launches(op._make_launch))
    monkeypatch.setattr(torch.cuda, "Event", NoEvent)
    return rec


def test_verify_attention_mla_launch(recorder):
    a = shapes.verify_args(width=32, page=16, pages_per_req=4)
    out, lse = kdtree.verify_attention(a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"],
                                       a["tree_mask"], max_tree_nodes=32, return_lse=True)
    assert out.shape == (8, 16, 512) and out.dtype == torch.bfloat16 and lse.shape == (8, 16)
    (_, size), (name, f) = recorder.calls
    assert name == "verify_attention"
    assert size == dict(batch=2, total=8, max_kv_len=64, head_dim_qk=576)
    spec = f["spec"]
    assert (spec.head_dim_qk, spec.head_dim_v, spec.num_q_heads, spec.num_kv_heads, spec.page_size,
            spec.max_tree_nodes, spec.dtype) == (576, 512, 16, 1, 16, 32, _lib.DTYPE_BF16)
    assert (f["batch_size"], f["total_nodes"], f["max_kv_len"], f["num_pages"], f["max_pages_per_req"]) == (2, 8, 64, 10, 4)
    assert f["q"] == a["q"].data_ptr() and f["k_cache"] == a["k_cache"].data_ptr() and f["v_cache"] is None
    assert f["page_table"] == a["page_table"].data_ptr() and f["kv_lens"] == a["kv_lens"].data_ptr()
    assert f["node_indptr"] == a["node_indptr"].data_ptr() and f["tree_mask"] == a["tree_mask"].data_ptr()
    assert f["out"] == out.data_ptr() and f["lse"] == lse.data_ptr()
    assert f["sm_scale"] == pytest.approx(1 / 24, rel=1e-6)
    assert f["stream"] == STREAM and f["num_splits"] == 0 and f["error_flags"] is None
    ws = _launch._workspaces[(-1, STREAM)]
    assert f["workspace"] == ws.data_ptr() and f["workspace_size"] == WORKSPACE and ws.numel() >= WORKSPACE


def test_verify_attention_gqa_launch_and_workspace_reuse(recorder):
    a = shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128, dtype=torch.float16)
    out = kdtree.verify_attention(a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"],
                                  a["tree_mask"], max_tree_nodes=16, v_cache=a["v_cache"], sm_scale=0.5, max_kv_len=40)
    assert out.shape == (8, 8, 128) and out.dtype == torch.float16
    f = recorder.calls[-1][1]
    assert f["v_cache"] == a["v_cache"].data_ptr() and f["lse"] is None and f["sm_scale"] == 0.5
    assert f["max_kv_len"] == 40 and f["spec"].num_kv_heads == 2 and f["spec"].dtype == _lib.DTYPE_F16
    first = f["workspace"]
    kdtree.verify_attention(a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"], a["tree_mask"],
                            max_tree_nodes=16, v_cache=a["v_cache"])
    assert recorder.calls[-1][1]["workspace"] == first  # cached per (device, stream), not reallocated


def test_verify_attention_workspace_inside_capture_is_not_the_cache(recorder, monkeypatch):
    a = shapes.verify_args()
    args = (a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"], a["tree_mask"])
    kdtree.verify_attention(*args, max_tree_nodes=16)
    cached = _launch._workspaces[(-1, STREAM)]
    monkeypatch.setattr(_launch, "capturing", lambda: True)
    kdtree.verify_attention(*args, max_tree_nodes=16)
    f = recorder.calls[-1][1]
    assert f["workspace"] != cached.data_ptr()  # allocated through torch (the graph's pool)
    assert _launch._workspaces[(-1, STREAM)] is cached


def test_tree_build_launch(recorder):
    a = shapes.tree_build_args(batch=3, depth=4, top_k=5, budget=10, width=16)
    r = kdtree.tree_build(**a)
    name, f = recorder.calls[-1]
    assert name == "tree_build"
    assert (f["batch_size"], f["depth"], f["top_k"], f["budget"], f["max_tree_nodes"]) == (3, 4, 5, 10, 16)
    for field in ("draft_tokens", "draft_logprobs", "root_tokens", "prefix_lens"):
        assert f[field] == a[field].data_ptr(), field
    for field in r._fields:
        assert f[field] == getattr(r, field).data_ptr(), field
    assert f["stream"] == STREAM


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_tree_accept_launch(recorder, packed):
    a = shapes.tree_accept_args(packed=packed)
    path, lens, bonus = kdtree.tree_accept(a["tokens"], a["parents"], a["node_counts"], a["target_tokens"],
                                           node_indptr=a["node_indptr"])
    name, f = recorder.calls[-1]
    assert name == "tree_accept" and (f["batch_size"], f["max_tree_nodes"]) == (3, 32)
    assert f["target_tokens"] == a["target_tokens"].data_ptr()
    assert f["node_indptr"] == (a["node_indptr"].data_ptr() if packed else None)
    assert f["total_nodes"] == (20 if packed else 0)
    assert (f["accepted_path"], f["accept_lens"], f["bonus_tokens"]) == (path.data_ptr(), lens.data_ptr(), bonus.data_ptr())
    assert path.shape == (3, 32) and lens.shape == (3,) and bonus.shape == (3,)


def test_sample_tokens_launch(recorder):
    wide = torch.zeros(5, 128, dtype=torch.bfloat16)
    offsets = torch.arange(5, dtype=torch.int64)
    out = kdtree.sample_tokens(wide[:, :100], temperature=0.7, seed=2**64 - 1, row_offsets=offsets)
    name, f = recorder.calls[-1]
    assert name == "sample_tokens"
    assert (f["num_rows"], f["vocab_size"], f["row_stride"], f["logits_dtype"]) == (5, 100, 128, _lib.DTYPE_BF16)
    assert f["seed"] == 2**64 - 1 and f["temperature"] == pytest.approx(0.7)
    assert f["row_offsets"] == offsets.data_ptr() and f["out_tokens"] == out.data_ptr()
    assert out.shape == (5,) and out.dtype == torch.int32


def _table(ptr, n):
    return (ctypes.c_int64 * n).from_address(ptr)[:]


def test_kv_compact_list_launch_builds_the_pointer_table_once(recorder):
    a = shapes.kv_compact_args(mla=False, row=(2, 64), layers=3)
    args = (a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"], a["accept_lens"])
    kdtree.kv_compact(a["k_caches"], *args, v_caches=a["v_caches"])
    name, f = recorder.calls[-1]
    assert name == "kv_compact"
    assert (f["num_layers"], f["batch_size"], f["max_tree_nodes"], f["page_size"], f["num_pages"]) == (3, 2, 16, 16, 8)
    assert (f["row_elems_k"], f["row_elems_v"], f["dtype"], f["max_pages_per_req"]) == (128, 128, _lib.DTYPE_BF16, 4)
    assert _table(f["k_caches"], 3) == [t.data_ptr() for t in a["k_caches"]]
    assert _table(f["v_caches"], 3) == [t.data_ptr() for t in a["v_caches"]]
    kdtree.kv_compact(a["k_caches"], *args, v_caches=a["v_caches"])
    assert recorder.calls[-1][1]["k_caches"] == f["k_caches"]  # the cached table
    assert len(_kv_compact._tables) == 2


def test_kv_compact_stacked_launch(recorder):
    a = shapes.kv_compact_args(stacked=True, layers=4, row=(1, 576))
    kdtree.kv_compact(a["k_caches"], a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"],
                      a["accept_lens"])
    f = recorder.calls[-1][1]
    k = a["k_caches"]
    assert f["num_layers"] == 4 and f["row_elems_k"] == 576 and f["row_elems_v"] == 0 and f["v_caches"] is None
    assert _table(f["k_caches"], 4) == [k[i].data_ptr() for i in range(4)]


def test_kv_compact_list_inside_capture_without_a_table_is_a_clear_error(recorder, monkeypatch):
    monkeypatch.setattr(_launch, "capturing", lambda: True)
    a = shapes.kv_compact_args()
    with pytest.raises(RuntimeError, match=r"^k_caches: the per-layer pointer table for these 3 caches"):
        kdtree.kv_compact(a["k_caches"], a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"],
                          a["accept_lens"])
    assert recorder.calls == []


def test_a_failing_call_raises_kdtree_error(recorder, monkeypatch):
    monkeypatch.setattr(recorder, "tree_accept", lambda rt, ref: _lib.ERROR_UNSUPPORTED, raising=False)
    monkeypatch.setattr(_lib, "last_error", lambda: "tree_accept: something unsupported")
    a = shapes.tree_accept_args()
    with pytest.raises(kdtree.Error) as e:
        kdtree.tree_accept(a["tokens"], a["parents"], a["node_counts"], a["target_tokens"])
    assert e.value.status == _lib.ERROR_UNSUPPORTED and e.value.message == "tree_accept: something unsupported"


def test_the_operators_launch_like_the_functions(recorder):
    # torch.ops.kdtree.* reach the same launch path (the dispatcher passes no argument equal to its default).
    v = shapes.verify_args()
    out, lse = torch.ops.kdtree.verify_attention(v["q"], v["k_cache"], None, v["page_table"], v["kv_lens"],
                                                 v["node_indptr"], v["tree_mask"], 16)
    assert out.shape == (8, 16, 512) and lse.shape == (0,) and recorder.calls[-1][0] == "verify_attention"
    out, lse = torch.ops.kdtree.verify_attention(v["q"], v["k_cache"], None, v["page_table"], v["kv_lens"],
                                                 v["node_indptr"], v["tree_mask"], 16, 0.5, 40, True)
    f = recorder.calls[-1][1]
    assert lse.shape == (8, 16) and f["lse"] == lse.data_ptr() and f["sm_scale"] == 0.5 and f["max_kv_len"] == 40
    t = shapes.tree_build_args()
    r = torch.ops.kdtree.tree_build(*t.values())
    assert len(r) == 9 and recorder.calls[-1][0] == "tree_build" and recorder.calls[-1][1]["tokens"] == r[0].data_ptr()
    a = shapes.tree_accept_args()
    path, _, _ = torch.ops.kdtree.tree_accept(a["tokens"], a["parents"], a["node_counts"], a["target_tokens"])
    assert recorder.calls[-1][0] == "tree_accept" and recorder.calls[-1][1]["accepted_path"] == path.data_ptr()
    s = shapes.sample_args()
    torch.ops.kdtree.sample_tokens(s["logits"])
    assert recorder.calls[-1][0] == "sample_tokens" and recorder.calls[-1][1]["seed"] == 0
    torch.ops.kdtree.sample_tokens(s["logits"], 0.5, -1)
    assert recorder.calls[-1][1]["seed"] == 2**64 - 1 and recorder.calls[-1][1]["temperature"] == 0.5
    k = shapes.kv_compact_args()
    torch.ops.kdtree.kv_compact(k["k_caches"], [], k["page_table"], k["kv_lens"], k["node_counts"],
                                k["accepted_path"], k["accept_lens"])
    assert recorder.calls[-1][0] == "kv_compact" and recorder.calls[-1][1]["v_caches"] is None


def test_tree_build_out_writes_into_the_given_tensors(recorder):
    a = shapes.tree_build_args(batch=3, width=32, budget=20)
    first = kdtree.tree_build(**a)
    again = kdtree.tree_build(**a, out=first)
    assert again is first
    f = recorder.calls[-1][1]
    for field in first._fields:
        assert f[field] == getattr(first, field).data_ptr(), field
    same = kdtree.tree_build(**a, out=tuple(first))
    assert [t.data_ptr() for t in same] == [t.data_ptr() for t in first]
    torch.ops.kdtree.tree_build_out(*a.values(), *first)
    assert recorder.calls[-1][1]["scores"] == first.scores.data_ptr()
    with pytest.raises(ValueError, match=r"^out\.tree_mask: expected shape \[3, 32, 1\], got \[3, 32, 2\]"):
        kdtree.tree_build(**a, out=first._replace(tree_mask=torch.zeros(3, 32, 2, dtype=torch.int64)))
    with pytest.raises(TypeError, match=r"^out\.scores: expected dtype float32"):
        kdtree.tree_build(**a, out=first._replace(scores=first.tokens))
    with pytest.raises(TypeError, match=r"^out: expected a TreeBuildResult"):
        kdtree.tree_build(**a, out=first[:3])


def _misaligned_like(t):
    """t's contents in a buffer whose data starts 2 bytes past a 16-byte boundary (a valid tensor still)."""
    flat = torch.zeros(t.numel() + 8, dtype=t.dtype)
    return flat[1:1 + t.numel()].view(t.shape)


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "stacked"])
def test_kv_compact_refuses_caches_the_kernel_cannot_copy_by_16_bytes(recorder, stacked):
    # The layer addresses live in a device table the C library cannot check: the package checks them.
    a = shapes.kv_compact_args(stacked=stacked, layers=3, row=(1, 576))
    k = a["k_caches"]
    bad = _misaligned_like(k) if stacked else [_misaligned_like(k[0])] + k[1:]
    assert (bad if stacked else bad[0]).data_ptr() % 16 == 2
    name = "k_caches[0][0]" if stacked else "k_caches[0]"
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}: its data starts at address 0x[0-9a-f]+, not 16-byte "
                                         r"aligned"):
        kdtree.kv_compact(bad, a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"],
                          a["accept_lens"])
    assert recorder.calls == []


def test_kv_compact_refuses_layers_that_share_memory(recorder):
    # Each layer (and K and V) is copied by its own CTAs at once: one buffer twice would race.
    a = shapes.kv_compact_args(mla=False, row=(2, 64), layers=3)
    args = (a["page_table"], a["kv_lens"], a["node_counts"], a["accepted_path"], a["accept_lens"])
    k, v = a["k_caches"], a["v_caches"]
    with pytest.raises(ValueError, match=r"^k_caches\[0\] and k_caches\[1\] share memory"):
        kdtree.kv_compact([k[0], k[0], k[2]], *args, v_caches=v)
    with pytest.raises(ValueError, match=r"share memory; every layer's K and V cache must be a separate buffer"):
        kdtree.kv_compact(k, *args, v_caches=k)
    assert recorder.calls == []
    kdtree.kv_compact(k, *args, v_caches=v)  # the same caches apart: launched
    assert recorder.calls[-1][0] == "kv_compact"


def test_scales_and_temperatures_are_checked_as_the_c_abi_floats_they_become(recorder):
    v = shapes.verify_args()
    call = (v["q"], v["k_cache"], v["page_table"], v["kv_lens"], v["node_indptr"], v["tree_mask"])
    with pytest.raises(ValueError, match=r"^sm_scale: expected a finite value > 0, got 1e-50 \(as float32"):
        kdtree.verify_attention(*call, max_tree_nodes=16, sm_scale=1e-50)
    s = shapes.sample_args()
    kdtree.sample_tokens(s["logits"], temperature=-math.inf)  # <= 0: greedy
    assert recorder.calls[-1][0] == "sample_tokens" and recorder.calls[-1][1]["temperature"] == -math.inf
    with pytest.raises(ValueError, match=r"^temperature: expected a finite value within float32's range"):
        kdtree.sample_tokens(s["logits"], temperature=1e39)
