"""CPU: e4m3 (torch.float8_e4m3fn) KV caches in the Python package: the dtype and scale checks of
verify_attention (function, operator and fake), kv_compact on fp8 caches, the ctypes structs carrying
kv_dtype and the scales down to the C call, and supported_shapes().kv_dtypes."""

import math

import pytest
import torch

import kdtree
import shapes
from kdtree import _lib, _verify_attention
from test_cpu_launch_path import recorder  # noqa: F401 (the fixture)

E4M3 = getattr(torch, "float8_e4m3fn", None)
pytestmark = pytest.mark.skipif(E4M3 is None, reason=f"torch {torch.__version__} has no float8_e4m3fn")


def _verify(a, **kw):
    return kdtree.verify_attention(a["q"], a["k_cache"], a["page_table"], a["kv_lens"], a["node_indptr"],
                                   a["tree_mask"], max_tree_nodes=a["max_tree_nodes"], v_cache=a["v_cache"], **kw)


def _fp8(a):
    a = dict(a)
    a["k_cache"] = a["k_cache"].to(E4M3)
    if a["v_cache"] is not None:
        a["v_cache"] = a["v_cache"].to(E4M3)
    return a


MLA8 = _fp8(shapes.verify_args())
GQA8 = _fp8(shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128))
MLA16 = shapes.verify_args()


@pytest.mark.parametrize("a", [MLA8, GQA8], ids=["mla", "gqa"])
@pytest.mark.parametrize("scales", [{}, dict(k_scale=0.5, v_scale=2.0), dict(k_scale=torch.tensor(0.25)),
                                    dict(v_scale=torch.tensor(3, dtype=torch.int32)), dict(k_scale=1)],
                         ids=["default", "floats", "0-d tensor", "0-d int tensor", "int"])
def test_fp8_caches_pass_every_check(a, scales):
    # CPU tensors: everything but the device is accepted.
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
        _verify(a, **scales)


@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, -math.inf, torch.tensor(0.0)],
                         ids=["0", "-1", "nan", "inf", "-inf", "0-d zero"])
def test_fp8_scales_must_be_positive_and_finite(name, bad):
    with pytest.raises(ValueError, match=rf"^{name}: expected a finite value > 0 for a float8_e4m3fn cache"):
        _verify(MLA8, **{name: bad})


@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
def test_scales_on_16bit_caches_are_refused_unless_one(name):
    with pytest.raises(ValueError, match=rf"^{name}: 2.0 given for a 16-bit cache; scales apply to "
                                         r"float8_e4m3fn caches only"):
        _verify(MLA16, **{name: 2.0})
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):  # 1.0 is the identity: accepted
        _verify(MLA16, **{name: 1.0})


@pytest.mark.parametrize("bad,exc,pattern", [
    (torch.ones(2), ValueError, r"^k_scale: expected a float or a 0-d tensor, got a tensor of shape \(2,\)"),
    (True, TypeError, r"^k_scale: expected a float, got bool"),
    ("1.0", TypeError, r"^k_scale: expected a float or a 0-d tensor, got str"),
    (torch.tensor(True), TypeError, r"^k_scale: expected a real 0-d tensor"),
], ids=["1-d tensor", "bool", "str", "bool tensor"])
def test_scale_types(bad, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _verify(MLA8, k_scale=bad)


def test_cache_dtypes_name_the_argument():
    a = dict(MLA8, k_cache=MLA8["k_cache"].float())
    with pytest.raises(TypeError, match=r"^k_cache: expected dtype bfloat16 \(q's dtype\) or float8_e4m3fn"):
        _verify(a)
    e5m2 = getattr(torch, "float8_e5m2", None)
    if e5m2 is not None:
        with pytest.raises(TypeError, match=r"^k_cache: expected dtype .* got float8_e5m2"):
            _verify(dict(MLA8, k_cache=MLA8["k_cache"].to(e5m2)))
    # K and V caches of different types.
    with pytest.raises(TypeError, match=r"^v_cache: expected dtype float8_e4m3fn \(k_cache's dtype"):
        _verify(dict(GQA8, v_cache=GQA8["v_cache"].to(torch.bfloat16)))
    g16 = shapes.verify_args(mla=False, heads=8, kv_heads=2, head_dim=128)
    with pytest.raises(TypeError, match=r"^v_cache: expected dtype bfloat16 \(k_cache's dtype"):
        _verify(dict(g16, v_cache=g16["v_cache"].to(E4M3)))


def test_the_operator_takes_scales_and_checks_them():
    a = MLA8
    with pytest.raises(ValueError, match=r"^k_scale: expected a finite value > 0"):
        torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], None, a["page_table"], a["kv_lens"],
                                          a["node_indptr"], a["tree_mask"], 16, None, None, False, -2.0, 1.0)


@pytest.mark.parametrize("mla", [True, False], ids=["mla", "gqa"])
def test_fake_shapes_with_fp8_caches(mla):
    a = _fp8(shapes.verify_args("meta", mla=mla, heads=8, kv_heads=2 if not mla else 1,
                                head_dim=576 if mla else 64))
    out, lse = torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], a["v_cache"], a["page_table"],
                                                 a["kv_lens"], a["node_indptr"], a["tree_mask"], 16, None, None,
                                                 True, 0.125, 0.5)
    assert tuple(out.shape) == (8, 8, 512 if mla else 64) and out.dtype == torch.bfloat16  # q's dtype
    assert tuple(lse.shape) == (8, 8) and lse.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^v_scale: expected a finite value > 0"):
        torch.ops.kdtree.verify_attention(a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["kv_lens"],
                                          a["node_indptr"], a["tree_mask"], 16, None, None, True, 1.0, 0.0)


def test_a_cuda_scale_tensor_during_graph_capture_asks_for_a_float(monkeypatch):
    class CudaScalar(torch.Tensor):  # a 0-d tensor that says it is on the GPU, without one
        @property
        def is_cuda(self):
            return True

    t = torch.tensor(0.5).as_subclass(CudaScalar)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"^k_scale: a CUDA tensor cannot be read during CUDA-graph capture.*"
                                           r"pass the scale as a Python float"):
        _verify_attention.scale("k_scale", t)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert _verify_attention.scale("k_scale", t) == 0.5  # outside capture: read with .item()


def test_launch_carries_kv_dtype_and_scales(recorder):  # noqa: F811
    a = MLA8
    _verify(a, k_scale=0.375, v_scale=torch.tensor(1.5))
    (_, size), (name, f) = recorder.calls
    assert name == "verify_attention"
    assert f["spec"].kv_dtype == _lib.KV_DTYPE_E4M3 and f["spec"].dtype == _lib.DTYPE_BF16
    assert f["k_scale"] == 0.375 and f["v_scale"] == 1.5
    recorder.calls.clear()
    _verify(MLA16)  # 16-bit caches: kv_dtype as_q, scales 0 (what the C ABI takes for them)
    (_, _), (_, f) = recorder.calls
    assert f["spec"].kv_dtype == _lib.KV_DTYPE_AS_Q and f["k_scale"] == 0.0 and f["v_scale"] == 0.0
    recorder.calls.clear()
    _verify(a, k_scale=0.25)  # another scale: another plan, not the cached one
    (_, _), (_, f) = recorder.calls
    assert f["k_scale"] == 0.25 and f["v_scale"] == 1.0


def test_kv_compact_moves_fp8_caches(recorder):  # noqa: F811
    k = shapes.kv_compact_args(row=(1, 576))
    k["k_caches"] = [t.to(E4M3) for t in k["k_caches"]]
    kdtree.kv_compact(k["k_caches"], k["page_table"], k["kv_lens"], k["node_counts"], k["accepted_path"],
                      k["accept_lens"])
    (name, f), = recorder.calls
    assert name == "kv_compact"
    assert f["kv_dtype"] == _lib.KV_DTYPE_E4M3 and f["row_elems_k"] == 576 and f["row_elems_v"] == 0
    g = shapes.kv_compact_args(row=(2, 64), mla=False)
    g["k_caches"] = [t.to(E4M3) for t in g["k_caches"]]
    g["v_caches"] = [t.to(E4M3) for t in g["v_caches"]]
    recorder.calls.clear()
    kdtree.kv_compact(g["k_caches"], g["page_table"], g["kv_lens"], g["node_counts"], g["accepted_path"],
                      g["accept_lens"], v_caches=g["v_caches"])
    (_, f), = recorder.calls
    assert f["kv_dtype"] == _lib.KV_DTYPE_E4M3 and f["row_elems_k"] == 128 and f["row_elems_v"] == 128


def test_kv_compact_fp8_checks():
    k = shapes.kv_compact_args(row=(1, 8))
    k["k_caches"] = [t.to(E4M3) for t in k["k_caches"]]
    with pytest.raises(ValueError, match=r"^k_caches: a token row holds 8 elements; kv_compact needs a "
                                         r"multiple of 16 for float8_e4m3fn caches"):
        kdtree.kv_compact(k["k_caches"], k["page_table"], k["kv_lens"], k["node_counts"], k["accepted_path"],
                          k["accept_lens"])
    g = shapes.kv_compact_args(row=(2, 64), mla=False)
    g["k_caches"] = [t.to(E4M3) for t in g["k_caches"]]
    with pytest.raises(ValueError, match=r"^v_caches: .* do not match k_caches'"):
        kdtree.kv_compact(g["k_caches"], g["page_table"], g["kv_lens"], g["node_counts"], g["accepted_path"],
                          g["accept_lens"], v_caches=g["v_caches"])


def test_supported_shapes_lists_kv_dtypes():
    s = kdtree.supported_shapes()
    assert s.kv_dtypes == ("as_q", "e4m3")
    assert s.default_grid.kv_dtypes[0] == "as_q"
    assert set(s.default_grid.kv_dtypes) <= set(s.kv_dtypes)
