"""verify_attention: tree attention over a paged KV cache (MLA or GQA), as torch.ops.kdtree.verify_attention."""

import ctypes
import math
import numbers
from typing import NamedTuple
from ctypes import byref as _byref

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._ops import lib
from ._plan_cache import PlanCache

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}  # torch dtype -> kdtree_dtype
E4M3 = getattr(torch, "float8_e4m3fn", None)  # the e4m3 cache dtype (torch >= 2.1)
_TORCH_DTYPES = {code: dt for dt, code in _DTYPES.items()}
_I32 = (torch.int32,)
# tree_mask: kdtree.h's uint64 words, which torch holds as int64 (or as uint64 where it has that dtype).
_I64 = (torch.int64,) + ((torch.uint64,) if hasattr(torch, "uint64") else ())


class Plan(NamedTuple):
    """Everything a launch depends on besides the tensors' addresses and the stream: every size the
    argument struct carries, the dtype, sm_scale and the device."""
    dtype: int             # kdtree_dtype
    total_nodes: int
    num_q_heads: int
    head_dim_qk: int
    head_dim_v: int
    num_kv_heads: int
    page_size: int
    max_tree_nodes: int
    batch_size: int
    max_pages_per_req: int
    num_pages: int
    max_kv_len: int
    sm_scale: float
    device: int            # CUDA index (-1: the CPU tests, or a fake implementation)
    kv_dtype: int = _lib.KV_DTYPE_AS_Q  # kdtree_kv_dtype of the caches
    k_scale: float = 0.0   # e4m3 caches: value = stored x scale; 0 (unused) for 16-bit caches
    v_scale: float = 0.0

    @property
    def mla(self):
        return self.head_dim_qk != self.head_dim_v


def scale(name, value):
    """A k_scale / v_scale argument as a Python float (None stays None). Python numbers, or 0-d tensors: a
    CPU tensor is read on the host; a CUDA tensor with .item(), which synchronises with the GPU and so is
    refused during CUDA-graph capture (pass a float there)."""
    if value is None or type(value) is float:
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(f"{name}: expected a float or a 0-d tensor, got a tensor of shape {tuple(value.shape)}")
        if value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name}: expected a real 0-d tensor, got dtype {C._dtype_name(value.dtype)}")
        if value.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{name}: a CUDA tensor cannot be read during CUDA-graph capture (reading it "
                               f"synchronises with the GPU); pass the scale as a Python float")
        return float(value.item())
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a float, got bool")
    if isinstance(value, numbers.Real):  # int, NumPy scalars; not strings
        return float(value)
    raise TypeError(f"{name}: expected a float or a 0-d tensor, got {type(value).__name__}")


def _cache_dtype(name, cache, q_dtype):
    """kdtree_kv_dtype of a cache: q's dtype (AS_Q) or float8_e4m3fn (E4M3); TypeError naming it otherwise."""
    dt = cache.dtype
    if dt == q_dtype:
        return _lib.KV_DTYPE_AS_Q
    if E4M3 is not None and dt == E4M3:
        return _lib.KV_DTYPE_E4M3
    raise TypeError(f"{name}: expected dtype {C._dtype_name(q_dtype)} (q's dtype) or float8_e4m3fn (an e4m3 "
                    f"cache with k_scale / v_scale), got {C._dtype_name(dt)}")


def _scales(kv_dtype, k_scale, v_scale):
    """The (k_scale, v_scale) a Plan carries: e4m3 caches default to 1.0 (the cache's values as torch reads
    them) and take positive finite floats; 16-bit caches take none (None or 1.0, carried as 0)."""
    if kv_dtype == _lib.KV_DTYPE_E4M3:
        out = []
        for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
            v = 1.0 if v is None else v
            C.positive_float32(name, v, f" for a float8_e4m3fn cache (value = stored x {name})")
            out.append(float(v))
        return tuple(out)
    for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
        if v is not None and v != 1.0:
            raise ValueError(f"{name}: {v} given for a 16-bit cache; scales apply to float8_e4m3fn caches only "
                             f"(leave it None or 1.0)")
    return 0.0, 0.0


def check(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale=None,
          max_kv_len=None, require_cuda=True, k_scale=None, v_scale=None):
    """The Plan of these arguments (shapes, dtypes, strides, devices; never data); raises TypeError/ValueError
    naming the argument that is wrong. k_scale / v_scale: Python floats or None (see scale())."""
    table = C.supported()
    qs = C.tensor("q", q, table.torch_dtypes, 3)
    total_nodes, num_q_heads, head_dim_qk = qs
    dtype = q.dtype
    ks = C.tensor("k_cache", k_cache, None, (3, 4), contiguous=False)
    kv_dtype = _cache_dtype("k_cache", k_cache, dtype)
    C.tensor("k_cache", k_cache)
    mla = table.head(head_dim_qk, mla=True)
    if v_cache is None:
        if mla is None:
            mlas = [h.head_dim_qk for h in table.heads if h.mla]
            raise ValueError(f"v_cache: required for GQA/MHA (q's head dim is {head_dim_qk}); only MLA "
                             f"(head dim {' or '.join(map(str, mlas))}) takes v_cache=None and reads V from k_cache")
        if len(ks) == 4:
            C.shape("k_cache", ks, (None, None, 1, head_dim_qk))
        else:
            C.shape("k_cache", ks, (None, None, head_dim_qk))
        num_kv_heads, head_dim_v = 1, mla.head_dim_v
    else:
        if mla is not None:
            raise ValueError(f"v_cache: MLA (head dim {head_dim_qk}) reads V from the first "
                             f"{mla.head_dim_v} dims of k_cache; pass v_cache=None")
        head = table.head(head_dim_qk, mla=False)
        if head is None:
            C.one_of("q.shape[2] (head dim)", head_dim_qk, tuple(h.head_dim_qk for h in table.heads), "head dim")
        if len(ks) != 4:
            C.tensor("k_cache", k_cache, None, 4)
        C.shape("k_cache", ks, (None, None, None, head_dim_qk))
        vs = C.tensor("v_cache", v_cache, None, 4, contiguous=False)
        if v_cache.dtype != k_cache.dtype:
            raise TypeError(f"v_cache: expected dtype {C._dtype_name(k_cache.dtype)} (k_cache's dtype: both caches "
                            f"hold one type), got {C._dtype_name(v_cache.dtype)}")
        if vs != ks:
            C.shape("v_cache", vs, tuple(ks))
        C.tensor("v_cache", v_cache)
        num_kv_heads, head_dim_v = ks[2], head.head_dim_v
        if num_kv_heads < 1:
            raise ValueError(f"k_cache: expected at least one KV head (shape [num_pages, page_size, num_kv_heads "
                             f">= 1, {head_dim_qk}]), got {list(ks)}")
        if num_q_heads % num_kv_heads != 0:
            raise ValueError(f"q: {num_q_heads} query heads is not a multiple of k_cache's {num_kv_heads} KV heads")
    num_pages, page_size = ks[0], ks[1]
    C.page_size("k_cache.shape[1] (page size)", page_size)
    w = C.integer("max_tree_nodes", max_tree_nodes)
    C.width("max_tree_nodes", w)
    batch_size, max_pages_per_req = C.tensor("page_table", page_table, _I32, 2)
    C.shape("kv_lens", C.tensor("kv_lens", kv_lens, _I32, 1), (batch_size,))
    C.shape("node_indptr", C.tensor("node_indptr", node_indptr, _I32, 1), (batch_size + 1,))
    C.shape("tree_mask", C.tensor("tree_mask", tree_mask, _I64, 2), (total_nodes, C.mask_words(w)))
    if batch_size < 1 or max_pages_per_req < 1:
        raise ValueError(f"page_table: expected at least one request and one page column (shape [B >= 1, "
                         f"max_pages_per_req >= 1]), got {list(page_table.shape)}")
    if not batch_size <= total_nodes <= batch_size * w:
        raise ValueError(f"q: {total_nodes} tree nodes (rows) for {batch_size} requests; each request has "
                         f"1..max_tree_nodes = {w} nodes")
    capacity = max_pages_per_req * page_size
    if max_kv_len is None:
        max_kv_len = capacity
    max_kv_len = C.integer("max_kv_len", max_kv_len)
    if not 1 <= max_kv_len <= _lib.MAX_KV_LEN:
        raise ValueError(f"max_kv_len: {max_kv_len} is out of range [1, {_lib.MAX_KV_LEN}] (KDTREE_MAX_KV_LEN)")
    if max_kv_len > capacity:
        raise ValueError(f"max_kv_len: {max_kv_len} exceeds page_table's capacity of {max_pages_per_req} pages "
                         f"x {page_size} = {capacity} positions")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim_qk)
    C.positive_float32("sm_scale", sm_scale)
    k_scale, v_scale = _scales(kv_dtype, k_scale, v_scale)
    index = C.device_index((("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table),
                            ("kv_lens", kv_lens), ("node_indptr", node_indptr), ("tree_mask", tree_mask)),
                           require_cuda)
    return Plan(_DTYPES[dtype], total_nodes, num_q_heads, head_dim_qk, head_dim_v, num_kv_heads, page_size, w,
                batch_size, max_pages_per_req, num_pages, max_kv_len, float(sm_scale), index, kv_dtype, k_scale,
                v_scale)


def _spec(p):
    return _lib.VerifySpec(p.head_dim_qk, p.head_dim_v, p.num_q_heads, p.num_kv_heads, p.page_size,
                           p.max_tree_nodes, p.dtype, p.kv_dtype)


def workspace_size(p):
    """Bytes of workspace the launch of plan `p` needs (host-only: sizes, never data); cached with the plan's
    Launch. The device's runtime must be current (_launch.device_guard)."""
    return _launches.get(p).extra.nbytes


def _workspace_size(p):
    spec = _spec(p)
    out = ctypes.c_size_t()
    _lib.check(_lib.api.verify_workspace_size(_launch.runtime(p.device), ctypes.byref(spec), p.batch_size,
                                              p.total_nodes, p.max_kv_len, ctypes.byref(out)),
               "kdtree_verify_workspace_size")
    return out.value


class _Extra:
    """Per plan, besides the struct: output shapes and the workspace size."""
    __slots__ = ("dtype", "out_shape", "out_stride", "lse_shape", "lse_stride", "nbytes")

    def __init__(self, p, nbytes):
        n, hq, dv = p.total_nodes, p.num_q_heads, p.head_dim_v
        self.dtype = _TORCH_DTYPES[p.dtype]
        self.out_shape, self.out_stride = (n, hq, dv), (hq * dv, dv, 1)
        self.lse_shape, self.lse_stride = (n, hq), (hq, 1)
        self.nbytes = nbytes


def _make_launch(p):
    with _launch.device_guard(p.device):  # creating the device's runtime binds its context
        nbytes = _workspace_size(p)
    args = _lib.VerifyArgs(_spec(p), p.batch_size, p.total_nodes, p.max_kv_len, p.num_pages,
                           max_pages_per_req=p.max_pages_per_req, sm_scale=p.sm_scale, workspace_size=nbytes,
                           k_scale=p.k_scale, v_scale=p.v_scale)
    return _launch.Launch(p, p.device, args, _Extra(p, nbytes))


_launches = _launch.Launches(_make_launch)  # Plan -> Launch
_cache = PlanCache()  # (scalars, tensors) -> Launch
_F32 = torch.float32
_EMPTY_SHAPE, _EMPTY_STRIDE = (0,), (1,)


def _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale, max_kv_len,
         return_lse, lse_placeholder=True, k_scale=None, v_scale=None):
    """Checks, allocates and launches; returns (out, lse). Without return_lse, lse is an empty [0] tensor
    (the operator must return one) or, for the plain function (lse_placeholder=False), None."""
    if v_cache is None:
        tensors = (q, k_cache, page_table, kv_lens, node_indptr, tree_mask)
    else:
        tensors = (q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask)
    scalars = (max_tree_nodes, type(max_tree_nodes), sm_scale, max_kv_len, type(max_kv_len), len(tensors), k_scale,
               v_scale)
    e = _cache.find(scalars, tensors)
    if e is None:  # not seen lately: check and plan
        e = _launches.get(check(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes,
                                sm_scale, max_kv_len, k_scale=k_scale, v_scale=v_scale))
        _cache.add(scalars, tensors, e)
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
                        max_kv_len, return_lse, lse_placeholder, k_scale, v_scale)
    x = e.extra
    empty = e.empty
    out = empty(x.out_shape, x.out_stride, x.dtype)
    a = e.args()
    if return_lse:
        lse = empty(x.lse_shape, x.lse_stride, _F32)
        a.lse = lse.data_ptr()
    else:
        lse = empty(_EMPTY_SHAPE, _EMPTY_STRIDE, _F32) if lse_placeholder else None
        a.lse = None
    stream = _launch.current_stream(index)
    a.q, a.node_indptr, a.k_cache = q.data_ptr(), node_indptr.data_ptr(), k_cache.data_ptr()
    a.v_cache = None if v_cache is None else v_cache.data_ptr()
    a.page_table, a.kv_lens, a.tree_mask = page_table.data_ptr(), kv_lens.data_ptr(), tree_mask.data_ptr()
    a.out, a.stream = out.data_ptr(), stream
    if x.nbytes:
        a.workspace = _launch.workspace(index, stream, x.nbytes).data_ptr()
    status = _lib.api.verify_attention(_launch.runtime(index), _byref(a))  # index is the current device (above)
    if status:
        _lib.check(status, "kdtree_verify_attention")
    return out, lse


lib.define("verify_attention(Tensor q, Tensor k_cache, Tensor? v_cache, Tensor page_table, Tensor kv_lens, "
           "Tensor node_indptr, Tensor tree_mask, int max_tree_nodes, float? sm_scale=None, int? max_kv_len=None, "
           "bool return_lse=False, float? k_scale=None, float? v_scale=None) -> (Tensor, Tensor)")


def _op(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale=None,
        max_kv_len=None, return_lse=False, k_scale=None, v_scale=None):
    """The operator: returns (out, lse); lse has shape [0] unless return_lse."""
    return _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
                max_kv_len, return_lse, True, k_scale, v_scale)


lib.impl("verify_attention", _op, "CUDA")
lib.impl("verify_attention", _op, "CPU")  # only to reach the checks ('expected a CUDA tensor'); the CPU tests


@torch.library.register_fake("kdtree::verify_attention", lib=lib)
def _(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale=None,
      max_kv_len=None, return_lse=False, k_scale=None, v_scale=None):
    p = check(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
              max_kv_len, require_cuda=False, k_scale=k_scale, v_scale=v_scale)
    out = q.new_empty((p.total_nodes, p.num_q_heads, p.head_dim_v))
    lse = q.new_empty((p.total_nodes, p.num_q_heads) if return_lse else (0,), dtype=torch.float32)
    return out, lse


_T = torch.Tensor
_TENSORS = ("q", "k_cache", "page_table", "kv_lens", "node_indptr", "tree_mask")


def verify_attention(q, k_cache, page_table, kv_lens, node_indptr, tree_mask, *, max_tree_nodes, v_cache=None,
                     sm_scale=None, max_kv_len=None, return_lse=False, k_scale=None, v_scale=None):
    """Tree attention of every draft-tree node over its request's paged KV prefix and its tree ancestors.

    q [total_nodes, Hq, Dqk] bf16/f16. MLA: k_cache [num_pages, page_size, 1, 576] (or [.., 576]) and
    v_cache None (V = the first 512 dims); GQA/MHA: k_cache and v_cache [num_pages, page_size, Hkv, D],
    D a GQA head dim of kdtree.supported_shapes().heads. page_table [B, max_pages_per_req] int32, kv_lens [B] int32 (prefix + tree nodes),
    node_indptr [B+1] int32, tree_mask [total_nodes, ceil(W/64)] int64 (bit j of node i: j is i or an
    ancestor), max_tree_nodes W one of kdtree.supported_shapes().widths. sm_scale defaults to 1/sqrt(Dqk); max_kv_len (a host
    upper bound of kv_lens) to max_pages_per_req * page_size.

    Caches hold q's dtype, or torch.float8_e4m3fn (both caches the same): then K = k_cache x k_scale and
    V = v_cache x v_scale (MLA: V = the first 512 dims of k_cache x v_scale). k_scale / v_scale: positive
    finite Python floats or 0-d tensors, default 1.0; a CUDA 0-d tensor is read with .item() (a host
    synchronisation), so during CUDA-graph capture pass floats. 16-bit caches take no scales (None or 1.0).

    Returns out [total_nodes, Hq, Dv] in q's dtype, and with return_lse=True also lse [total_nodes, Hq]
    float32 (natural log). Runs on torch's current stream of q's device; never synchronises.
    """
    k_scale, v_scale = scale("k_scale", k_scale), scale("v_scale", v_scale)
    if type(q) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        out, lse = _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
                        max_kv_len, return_lse, False, k_scale, v_scale)
    else:
        # torch's dispatcher would reject a non-tensor without naming it: check here.
        for name, t in zip(_TENSORS, (q, k_cache, page_table, kv_lens, node_indptr, tree_mask)):
            C.tensor(name, t, contiguous=False)
        if v_cache is not None:
            C.tensor("v_cache", v_cache, contiguous=False)
        max_tree_nodes = C.integer("max_tree_nodes", max_tree_nodes)
        if max_kv_len is not None:
            max_kv_len = C.integer("max_kv_len", max_kv_len)
        out, lse = torch.ops.kdtree.verify_attention(q, k_cache, v_cache, page_table, kv_lens, node_indptr,
                                                     tree_mask, max_tree_nodes, sm_scale, max_kv_len, return_lse,
                                                     k_scale, v_scale)
    return (out, lse) if return_lse else out
