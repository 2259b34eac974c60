"""verify_attention: tree attention over a paged KV cache (MLA or GQA), as torch.ops.kdtree.verify_attention."""

import ctypes
import math
from collections import namedtuple
from typing import Optional, Tuple

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._plan_cache import PlanCache

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}
_DTYPE_KEYS = tuple(_DTYPES)
_I32 = (torch.int32,)
_I64 = (torch.int64,)

Plan = namedtuple("Plan", "mla head_dim_qk head_dim_v num_q_heads num_kv_heads page_size max_tree_nodes dtype "
                          "batch_size total_nodes max_kv_len num_pages max_pages_per_req sm_scale device")


_T = torch.Tensor
_INT32, _INT64 = torch.int32, torch.int64
_PAGE_SET = frozenset(C.PAGE_SIZES)
_WIDTH_SET = frozenset(C.TREE_WIDTHS)
_GQA_SET = frozenset(C.GQA_HEAD_DIMS)
_DEFAULT_SCALE = {d: 1.0 / math.sqrt(d) for d in C.GQA_HEAD_DIMS + (C.MLA_HEAD_DIM_QK,)}


def _fast_key(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, w, sm_scale, max_kv_len):
    """The common case in one pass of cheap tests: the launch key (what _key(plan(...)) would be), or None;
    then plan() (the authority, which names what is wrong) decides. Accepts nothing that plan() rejects.
    Every fact the launch depends on is either tested here or part of the key."""
    if (type(q) is not _T or type(k_cache) is not _T or type(page_table) is not _T or type(kv_lens) is not _T
            or type(node_indptr) is not _T or type(tree_mask) is not _T or type(w) is not int):
        return None
    dtype = q.dtype
    code = _DTYPES.get(dtype)
    qs = q.shape
    if code is None or len(qs) != 3 or k_cache.dtype is not dtype or not q.is_contiguous() or not k_cache.is_contiguous():
        return None
    n, hq, d = qs
    ks = k_cache.shape
    if v_cache is None:
        if d != 576 or not ((len(ks) == 4 and ks[2] == 1 and ks[3] == 576) or (len(ks) == 3 and ks[2] == 576)):
            return None
        hkv = 1
    else:
        if (type(v_cache) is not _T or d not in _GQA_SET or len(ks) != 4 or ks[3] != d or v_cache.dtype is not dtype
                or v_cache.shape != ks or not v_cache.is_contiguous()):
            return None
        hkv = ks[2]
        if hkv < 1 or hq % hkv:
            return None
    page = ks[1]
    ps = page_table.shape
    if page not in _PAGE_SET or w not in _WIDTH_SET or len(ps) != 2 or page_table.dtype is not _INT32:
        return None
    b, m = ps
    if (b < 1 or not b <= n <= b * w or kv_lens.dtype is not _INT32 or kv_lens.shape != (b,)
            or node_indptr.dtype is not _INT32 or node_indptr.shape != (b + 1,) or tree_mask.dtype is not _INT64
            or tree_mask.shape != (n, (w + 63) // 64) or not page_table.is_contiguous() or not kv_lens.is_contiguous()
            or not node_indptr.is_contiguous() or not tree_mask.is_contiguous()):
        return None
    capacity = m * page
    if max_kv_len is None:
        max_kv_len = capacity
    elif type(max_kv_len) is not int or not 0 <= max_kv_len <= capacity or max_kv_len > C.INT32_MAX:
        return None
    if sm_scale is None:
        sm_scale = _DEFAULT_SCALE[d]
    elif not (type(sm_scale) in (float, int) and 0 < sm_scale < math.inf):
        return None
    # One CUDA device (or, for the CPU tests and benchmark only, all CPU).
    cuda = q.is_cuda
    if not cuda and not C.accept_cpu(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask):
        return None
    index = q.get_device()
    if (k_cache.get_device() != index or page_table.get_device() != index or kv_lens.get_device() != index
            or node_indptr.get_device() != index or tree_mask.get_device() != index
            or k_cache.is_cuda is not cuda or page_table.is_cuda is not cuda or kv_lens.is_cuda is not cuda
            or node_indptr.is_cuda is not cuda or tree_mask.is_cuda is not cuda
            or (v_cache is not None and (v_cache.get_device() != index or v_cache.is_cuda is not cuda))):
        return None
    return code, n, hq, d, hkv, page, w, b, m, ks[0], max_kv_len, sm_scale, index


def _key(p):
    """The launch key of a checked plan (the same tuple _fast_key computes)."""
    index = C.device_index(p.device)
    return (p.dtype, p.total_nodes, p.num_q_heads, p.head_dim_qk, p.num_kv_heads, p.page_size, p.max_tree_nodes,
            p.batch_size, p.max_pages_per_req, p.num_pages, p.max_kv_len, p.sm_scale, index)


def plan(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale=None,
         max_kv_len=None, require_cuda=True):
    """Checks the arguments (shapes, dtypes, strides, devices; never data) and derives the kernel spec."""
    C.tensor("q", q, dtypes=_DTYPE_KEYS, ndim=3)
    C.contiguous("q", q)
    total_nodes, num_q_heads, head_dim_qk = q.shape
    C.tensor("k_cache", k_cache, ndims=(3, 4))
    if k_cache.dtype != q.dtype:
        raise TypeError(f"k_cache: expected dtype {C._dtype_name(q.dtype)} (q's dtype), got {C._dtype_name(k_cache.dtype)}")
    C.contiguous("k_cache", k_cache)
    if v_cache is None:
        if head_dim_qk != C.MLA_HEAD_DIM_QK:
            raise ValueError(f"v_cache: required for GQA/MHA (q's head dim is {head_dim_qk}); only MLA "
                             f"(head dim {C.MLA_HEAD_DIM_QK}) takes v_cache=None and reads V from k_cache")
        if len(k_cache.shape) == 4:
            C.shape("k_cache", k_cache, (None, None, 1, C.MLA_HEAD_DIM_QK))
        else:
            C.shape("k_cache", k_cache, (None, None, C.MLA_HEAD_DIM_QK))
        mla, num_kv_heads, head_dim_v = True, 1, C.MLA_HEAD_DIM_V
    else:
        if head_dim_qk == C.MLA_HEAD_DIM_QK:
            raise ValueError(f"v_cache: MLA (head dim {C.MLA_HEAD_DIM_QK}) reads V from the first "
                             f"{C.MLA_HEAD_DIM_V} dims of k_cache; pass v_cache=None")
        C.one_of("q.shape[2] (head dim)", head_dim_qk, C.GQA_HEAD_DIMS + (C.MLA_HEAD_DIM_QK,), "head dim")
        C.tensor("k_cache", k_cache, ndim=4)
        C.shape("k_cache", k_cache, (None, None, None, head_dim_qk))
        C.tensor("v_cache", v_cache, ndim=4)
        if v_cache.dtype != q.dtype:
            raise TypeError(f"v_cache: expected dtype {C._dtype_name(q.dtype)} (q's dtype), got {C._dtype_name(v_cache.dtype)}")
        C.shape("v_cache", v_cache, tuple(k_cache.shape))
        C.contiguous("v_cache", v_cache)
        mla, num_kv_heads, head_dim_v = False, k_cache.shape[2], head_dim_qk
        if num_kv_heads < 1 or num_q_heads % num_kv_heads != 0:
            raise ValueError(f"q: {num_q_heads} query heads is not a multiple of k_cache's {num_kv_heads} KV heads")
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    C.one_of("k_cache.shape[1] (page size)", page_size, C.PAGE_SIZES, "page size")
    max_tree_nodes = C.integer("max_tree_nodes", max_tree_nodes)
    C.one_of("max_tree_nodes", max_tree_nodes, C.TREE_WIDTHS, "tree width")
    C.tensor("page_table", page_table, dtypes=_I32, ndim=2)
    C.contiguous("page_table", page_table)
    batch_size, max_pages_per_req = page_table.shape
    C.tensor("kv_lens", kv_lens, dtypes=_I32, ndim=1)
    C.shape("kv_lens", kv_lens, (batch_size,))
    C.contiguous("kv_lens", kv_lens)
    C.tensor("node_indptr", node_indptr, dtypes=_I32, ndim=1)
    C.shape("node_indptr", node_indptr, (batch_size + 1,))
    C.contiguous("node_indptr", node_indptr)
    C.tensor("tree_mask", tree_mask, dtypes=_I64, ndim=2)
    C.shape("tree_mask", tree_mask, (total_nodes, C.mask_words(max_tree_nodes)))
    C.contiguous("tree_mask", tree_mask)
    if batch_size < 1:
        raise ValueError(f"page_table: expected at least one request (shape [B >= 1, max_pages_per_req]), got "
                         f"{list(page_table.shape)}")
    if not batch_size <= total_nodes <= batch_size * max_tree_nodes:
        raise ValueError(f"q: {total_nodes} tree nodes (rows) for {batch_size} requests; each request has "
                         f"1..max_tree_nodes = {max_tree_nodes} nodes")
    if max_kv_len is None:
        max_kv_len = max_pages_per_req * page_size
    max_kv_len = C.integer("max_kv_len", max_kv_len)
    C.int32_range("max_kv_len", max_kv_len)
    if max_kv_len > max_pages_per_req * page_size:
        raise ValueError(f"max_kv_len: {max_kv_len} exceeds page_table's capacity of {max_pages_per_req} pages "
                         f"x {page_size} = {max_pages_per_req * page_size} positions")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim_qk)
    if not (math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"sm_scale: expected a finite value > 0, got {sm_scale}")
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table),
             ("kv_lens", kv_lens), ("node_indptr", node_indptr), ("tree_mask", tree_mask)]
    device = C.same_device(named) if require_cuda else q.device
    return Plan(mla, head_dim_qk, head_dim_v, num_q_heads, num_kv_heads, page_size, max_tree_nodes,
                _DTYPES[q.dtype], batch_size, total_nodes, max_kv_len, num_pages, max_pages_per_req,
                float(sm_scale), device)


def _spec(p):
    return _lib.VerifySpec(p.head_dim_qk, p.head_dim_v, p.num_q_heads, p.num_kv_heads, p.page_size,
                           p.max_tree_nodes, p.dtype)


_workspace_sizes = {}  # (device, spec, batch, nodes, max_kv_len) -> bytes; host-only facts, so cacheable


def workspace_size(p):
    """Bytes of workspace the launch needs (host-only: sizes, never data)."""
    key = p[:11] + (p.device.index,)
    n = _workspace_sizes.get(key)
    if n is None:
        spec = _spec(p)
        out = ctypes.c_size_t()
        _lib.check(_lib.api.verify_workspace_size(_launch.runtime(p.device.index), ctypes.byref(spec),
                                                  p.batch_size, p.total_nodes, p.max_kv_len, ctypes.byref(out)),
                   "kdtree_verify_workspace_size")
        n = _workspace_sizes[key] = out.value
    return n


# Launch key -> _Launch: everything a launch needs besides the tensors' addresses and the stream. The key
# holds every size the argument struct carries, the dtype, sm_scale and the device, so an entry is never
# used for arguments that would fill the struct differently. Bounded: cleared when full (a caller that
# varies max_kv_len on every call still plans from scratch, as without the cache).
_LAUNCH_CACHE_SIZE = 256
_launches = {}


class _Launch:
    __slots__ = ("args", "dtype", "out_shape", "out_stride", "lse_shape", "lse_stride", "nbytes", "device", "index",
                 "empty")

    def __init__(self, p, nbytes, index):
        n, hq, dv = p.total_nodes, p.num_q_heads, p.head_dim_v
        self.dtype = _TORCH_DTYPES[p.dtype]
        self.out_shape, self.out_stride = (n, hq, dv), (hq * dv, dv, 1)
        self.lse_shape, self.lse_stride = (n, hq), (hq, 1)
        self.nbytes, self.device, self.index = nbytes, p.device, index
        self.empty = _launch.empty_fn(self.index)
        # The struct's sizes once; each call copies it and fills in the addresses and the stream.
        self.args = bytes(_lib.VerifyArgs(_spec(p), p.batch_size, p.total_nodes, p.max_kv_len, p.num_pages,
                                          max_pages_per_req=p.max_pages_per_req, sm_scale=p.sm_scale,
                                          workspace_size=nbytes))


_TORCH_DTYPES = {code: dt for dt, code in _DTYPES.items()}


def _launch_for(p):
    key = _key(p)
    entry = _launches.get(key)
    if entry is None:
        with _launch.device_guard(p.device.index):  # creating the device's runtime binds its context
            nbytes = workspace_size(p)
        entry = _Launch(p, nbytes, key[-1])
        if len(_launches) >= _LAUNCH_CACHE_SIZE:
            _launches.clear()
        _launches[key] = entry
    return entry


_cache = PlanCache()  # (scalars, tensors) -> _Launch
_VerifyArgs = _lib.VerifyArgs
_F32 = torch.float32


def _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale, max_kv_len,
         return_lse, lse_placeholder=True):
    """Checks, allocates and launches; returns (out, lse). Without return_lse, lse is an empty [0] tensor
    (the operator must return one) or, for the plain function (lse_placeholder=False), None."""
    if v_cache is None:
        tensors = (q, k_cache, page_table, kv_lens, node_indptr, tree_mask)
    else:
        tensors = (q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask)
    scalars = (max_tree_nodes, type(max_tree_nodes), sm_scale, max_kv_len, type(max_kv_len), len(tensors))
    e = _cache.find(scalars, tensors)
    if e is None:  # not seen lately: the quick test, else the full checks (which name what is wrong)
        e = _launches.get(_fast_key(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask,
                                    max_tree_nodes, sm_scale, max_kv_len))
        if e is None:
            e = _launch_for(plan(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes,
                                 sm_scale, max_kv_len))
        _cache.add(scalars, tensors, e)
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
                        max_kv_len, return_lse, lse_placeholder)
    empty = e.empty
    out = empty(e.out_shape, e.out_stride, e.dtype)
    a = _VerifyArgs.from_buffer_copy(e.args)
    if return_lse:
        lse = empty(e.lse_shape, e.lse_stride, _F32)
        a.lse = lse.data_ptr()
    else:
        lse = empty((0,), (1,), _F32) if lse_placeholder else None
    stream = _launch.current_stream(index)
    a.q, a.node_indptr, a.k_cache = q.data_ptr(), node_indptr.data_ptr(), k_cache.data_ptr()
    if v_cache is not None:
        a.v_cache = v_cache.data_ptr()
    a.page_table, a.kv_lens, a.tree_mask = page_table.data_ptr(), kv_lens.data_ptr(), tree_mask.data_ptr()
    a.out, a.stream = out.data_ptr(), stream
    if e.nbytes:
        a.workspace = _launch.workspace(e.device, stream, e.nbytes).data_ptr()
    status = _launch.call(_lib.api.verify_attention, index, a)
    if status:
        _lib.check(status, "kdtree_verify_attention")
    return out, lse


@torch.library.custom_op("kdtree::verify_attention", mutates_args=())
def verify_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
                        page_table: torch.Tensor, kv_lens: torch.Tensor, node_indptr: torch.Tensor,
                        tree_mask: torch.Tensor, max_tree_nodes: int, sm_scale: Optional[float] = None,
                        max_kv_len: Optional[int] = None, return_lse: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """The operator: returns (out, lse); lse has shape [0] unless return_lse."""
    return _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
                max_kv_len, return_lse)


@verify_attention_op.register_fake
def _(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale=None,
      max_kv_len=None, return_lse=False):
    p = plan(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
             max_kv_len, require_cuda=False)
    out = q.new_empty((p.total_nodes, p.num_q_heads, p.head_dim_v))
    lse = q.new_empty((p.total_nodes, p.num_q_heads) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def verify_attention(q, k_cache, page_table, kv_lens, node_indptr, tree_mask, *, max_tree_nodes, v_cache=None,
                     sm_scale=None, max_kv_len=None, return_lse=False):
    """Tree attention of every draft-tree node over its request's paged KV prefix and its tree ancestors.

    q [total_nodes, Hq, Dqk] bf16/f16. MLA: k_cache [num_pages, page_size, 1, 576] (or [.., 576]) and
    v_cache None (V = the first 512 dims); GQA/MHA: k_cache and v_cache [num_pages, page_size, Hkv, D],
    D in {64, 128, 256}. page_table [B, max_pages_per_req] int32, kv_lens [B] int32 (prefix + tree nodes),
    node_indptr [B+1] int32, tree_mask [total_nodes, ceil(W/64)] int64 (bit j of node i: j is i or an
    ancestor), max_tree_nodes W in {16, 32, 64, 128}. sm_scale defaults to 1/sqrt(Dqk); max_kv_len (a host
    upper bound of kv_lens) to max_pages_per_req * page_size.

    Returns out [total_nodes, Hq, Dv] in q's dtype, and with return_lse=True also lse [total_nodes, Hq]
    float32 (natural log). Runs on torch's current stream of q's device; never synchronises.
    """
    if type(q) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        out, lse = _run(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes, sm_scale,
                        max_kv_len, return_lse, False)
    else:
        out, lse = torch.ops.kdtree.verify_attention(q, k_cache, v_cache, page_table, kv_lens, node_indptr,
                                                     tree_mask, max_tree_nodes, sm_scale, max_kv_len, return_lse)
    return (out, lse) if return_lse else out
