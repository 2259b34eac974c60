"""kv_compact: moves the accepted path's KV rows into place for every layer, as torch.ops.kdtree.kv_compact.

The C call takes a device array of per-layer cache pointers. Building it is a host->device copy, which
must not happen inside CUDA-graph capture and should not cost a copy per call, so the tables are cached
per device, keyed by the pointers themselves (a table only holds addresses, so a key always maps to the
right content). A table is built outside capture from pinned memory with a non-blocking copy (no host
synchronisation) and kept for the life of the process (8 bytes per layer), so a captured graph can read
it on every replay. The stacked form [num_layers, num_pages, ...] needs no copy at all: its table is
base + layer * stride, computed on the device (also inside capture).
"""

import math
import threading
from typing import NamedTuple
from ctypes import byref as _byref

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._ops import lib
from ._plan_cache import PlanCache

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}  # torch dtype -> kdtree_dtype
_E4M3 = getattr(torch, "float8_e4m3fn", None)  # e4m3 caches: rows move as bytes (kv_dtype E4M3)
_T = torch.Tensor
_I32 = (torch.int32,)


def _same_layers(caches):
    """Every layer a plain contiguous tensor with the first one's shape, dtype and device: the common case,
    tested in one cheap pass (a model has tens of layers)."""
    first = caches[0]
    if type(first) is not _T:
        return False
    shape, dtype, device, cuda = first.shape, first.dtype, first.get_device(), first.is_cuda
    for t in caches:
        if (type(t) is not _T or t.shape != shape or t.dtype != dtype or t.get_device() != device
                or t.is_cuda is not cuda or not t.is_contiguous()):
            return False
    return True


def _layers(name, caches, stacked, dtypes):
    """The per-layer [num_pages, page_size, ...] geometry of a cache list or a stacked tensor."""
    if stacked:
        if len(caches) != 1:
            raise ValueError(f"{name}: the stacked form is one tensor [num_layers, num_pages, page_size, ...]")
        s = C.tensor(name, caches[0], dtypes, contiguous=False)
        if len(s) < 4:
            raise ValueError(f"{name}: expected [num_layers, num_pages, page_size, ...] (4 or more dimensions), "
                             f"got shape {list(s)}")
        C.tensor(name, caches[0])
        return s[0], tuple(s[1:]), caches[0].dtype
    if len(caches) == 0:
        raise ValueError(f"{name}: expected at least one layer's cache")
    if _same_layers(caches):  # then the first layer's checks stand for all
        s = C.tensor(f"{name}[0]", caches[0], dtypes)
        if len(s) >= 3:
            return len(caches), tuple(s), caches[0].dtype
    first = None
    for i, t in enumerate(caches):
        n = f"{name}[{i}]"
        s = C.tensor(n, t, dtypes, contiguous=False)
        if len(s) < 3:
            raise ValueError(f"{n}: expected [num_pages, page_size, ...] (3 or more dimensions), got shape "
                             f"{list(s)}")
        C.tensor(n, t)
        if first is None:
            first = t
        elif s != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{n}: shape {list(s)} {C._dtype_name(t.dtype)} on {t.device} differs from "
                             f"{name}[0]'s {list(first.shape)} {C._dtype_name(first.dtype)} on {first.device}; "
                             f"every layer must match")
    return len(caches), tuple(first.shape), first.dtype


class Plan(NamedTuple):
    """What a launch depends on besides addresses (and pointer tables) and the stream."""
    num_layers: int
    num_pages: int
    page_size: int
    row_elems_k: int
    row_elems_v: int  # 0: no V caches (MLA)
    dtype: int        # kdtree_dtype (BF16 for e4m3 caches: the C call checks it, the element size is kv_dtype's)
    batch_size: int
    max_pages_per_req: int
    max_tree_nodes: int
    device: int       # CUDA index (-1: the CPU tests, or a fake implementation)
    kv_dtype: int = _lib.KV_DTYPE_AS_Q  # E4M3: 1-byte elements


def check(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked,
          require_cuda=True):
    """The Plan of these arguments (caches as lists; stacked: one-element lists of [L, P, page, ...]);
    raises TypeError/ValueError naming the argument that is wrong."""
    dtypes = C.supported().torch_dtypes + ((_E4M3,) if _E4M3 is not None else ())
    num_layers, k_geom, dtype = _layers("k_caches", k_caches, stacked, dtypes)
    num_pages, page_size = k_geom[0], k_geom[1]
    C.page_size("k_caches page size", page_size)
    row_k = math.prod(k_geom[2:])
    row_v = 0
    if v_caches is not None:
        v_layers, v_geom, v_dtype = _layers("v_caches", v_caches, stacked, dtypes)
        if v_layers != num_layers or v_geom[:2] != k_geom[:2] or v_dtype != dtype:
            raise ValueError(f"v_caches: {v_layers} layers of {list(v_geom)} {C._dtype_name(v_dtype)} do not "
                             f"match k_caches' {num_layers} layers of {list(k_geom)} {C._dtype_name(dtype)} "
                             f"(layers, pages, page size and dtype must agree)")
        row_v = math.prod(v_geom[2:])
    fp8 = dtype == _E4M3
    per_vec = 16 if fp8 else 8  # elements per 16-byte vector
    for name, row in (("k_caches", row_k), ("v_caches", row_v)):
        if row % per_vec != 0:
            raise ValueError(f"{name}: a token row holds {row} elements; kv_compact needs a multiple of {per_vec} "
                             f"for {C._dtype_name(dtype)} caches (rows move as 16-byte vectors)")
        C.int32_range(f"{name} row elements", row)
    batch, max_pages = C.tensor("page_table", page_table, _I32, 2)
    for name, t in (("kv_lens", kv_lens), ("node_counts", node_counts), ("accept_lens", accept_lens)):
        C.shape(name, C.tensor(name, t, _I32, 1), (batch,))
    ps = C.tensor("accepted_path", accepted_path, _I32, 2)
    if ps[0] != batch:
        raise ValueError(f"accepted_path: expected shape [{batch}, W], got {list(ps)}")
    w = ps[1]
    C.width("accepted_path.shape[1] (max_tree_nodes)", w)
    named = (("k_caches", k_caches[0]), ("v_caches", None if v_caches is None else v_caches[0]),
             ("page_table", page_table), ("kv_lens", kv_lens), ("node_counts", node_counts),
             ("accepted_path", accepted_path), ("accept_lens", accept_lens))
    return Plan(num_layers, num_pages, page_size, row_k, row_v, _lib.DTYPE_BF16 if fp8 else _DTYPES[dtype], batch,
                max_pages, w, C.device_index(named, require_cuda),
                _lib.KV_DTYPE_E4M3 if fp8 else _lib.KV_DTYPE_AS_Q)


class _Table:
    """A device pointer table (and its address), the pinned host copy it was uploaded from (which must
    outlive the asynchronous copy), and until it is known complete, the event after its build and the
    stream it was built on (a launch on another stream waits for that event)."""
    __slots__ = ("table", "ptr", "host", "event", "stream")

    def __init__(self, table, host, stream):
        self.table, self.ptr, self.host, self.stream = table, table.data_ptr(), host, stream
        self.event = torch.cuda.Event()
        self.event.record()


_tables_lock = threading.Lock()
_tables = {}  # key -> _Table


def _device(index):
    return C.cuda_device(index) if index >= 0 else torch.device("cpu")  # CPU: C.ACCEPT_CPU (tests) only


def _table_key(caches, stacked, index):
    """What a pointer table depends on: the per-layer addresses (stacked: base, layers and layer stride)."""
    if stacked:
        t = caches[0]
        return (index, "stacked", t.data_ptr(), t.shape[0], t.stride(0) * t.element_size())
    return (index, tuple(map(_T.data_ptr, caches)))


def _spans(name, caches, stacked):
    """(name of the layer, first byte, bytes) of every layer's cache."""
    if stacked:
        t = caches[0]
        size, stride = t[0].numel() * t.element_size(), t.stride(0) * t.element_size()
        return [(f"{name}[0][{i}]", t.data_ptr() + i * stride, size) for i in range(t.shape[0])]
    return [(f"{name}[{i}]", t.data_ptr(), t.numel() * t.element_size()) for i, t in enumerate(caches)]


def _check_addresses(k_caches, v_caches, stacked):
    """The kernel moves rows as 16-byte vectors and the layers' copies run concurrently: every layer's cache
    must start 16-byte aligned, and no two may share memory (their rows would be moved by two CTAs at once)."""
    spans = _spans("k_caches", k_caches, stacked) + ([] if v_caches is None else _spans("v_caches", v_caches, stacked))
    for name, start, _ in spans:
        if start % 16:
            raise ValueError(f"{name}: its data starts at address {start:#x}, not 16-byte aligned (kv_compact moves "
                             f"rows as 16-byte vectors); pass a cache whose storage offset keeps that alignment")
    spans.sort(key=lambda s: s[1])
    for (a, a0, an), (b, b0, _) in zip(spans, spans[1:]):
        if a0 + an > b0:
            raise ValueError(f"{a} and {b} share memory; every layer's K and V cache must be a separate buffer "
                             f"(kv_compact moves their rows concurrently)")


_checked_lock = threading.Lock()
_checked = set()  # (k table key, v table key) whose addresses passed _check_addresses


def _pointer_table(name, caches, stacked, index, stream, key):
    """The device address of the table of per-layer cache addresses (key: _table_key's)."""
    hit = _tables.get(key)
    if hit is not None:
        if hit.event is not None and hit.stream != stream and not _launch.capturing():
            if hit.event.query():
                hit.event = None  # complete: every stream may read it from now on
            else:
                torch.cuda.current_stream(_device(index)).wait_event(hit.event)
        return hit.ptr
    device = _device(index)
    if stacked:
        _, _, base, layers, stride = key
        table = torch.arange(layers, dtype=torch.int64, device=device) * stride + base
        if _launch.capturing():
            return table.data_ptr()  # in the graph's pool, alive as long as the graph
        entry = _Table(table, None, stream)
    else:
        if _launch.capturing():
            raise RuntimeError(
                f"{name}: the per-layer pointer table for these {len(caches)} caches is not on the device yet, "
                f"and it cannot be uploaded inside CUDA-graph capture; call kdtree.kv_compact once with the "
                f"same caches before capturing (warm-up), or pass the caches as one stacked tensor")
        ptrs = key[1]
        host = torch.tensor(ptrs, dtype=torch.int64).pin_memory()
        table = torch.empty(len(ptrs), dtype=torch.int64, device=device)
        table.copy_(host, non_blocking=True)
        entry = _Table(table, host, stream)
    with _tables_lock:
        return _tables.setdefault(key, entry).ptr


def _make_launch(p):
    return _launch.Launch(p, p.device, _lib.KvCompactArgs(
        p.num_layers, p.batch_size, p.max_tree_nodes, p.page_size, p.num_pages, p.row_elems_k, p.row_elems_v,
        p.dtype, max_pages_per_req=p.max_pages_per_req, kv_dtype=p.kv_dtype))


_launches = _launch.Launches(_make_launch)
_cache = PlanCache()  # (scalars, tensors) -> Launch


def _run(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked):
    if type(k_caches) is list and (v_caches is None or type(v_caches) is list):
        tensors = (page_table, kv_lens, node_counts, accepted_path, accept_lens, *k_caches, *(v_caches or ()))
        scalars = (stacked, len(k_caches), None if v_caches is None else len(v_caches))
        e = _cache.find(scalars, tensors)
    else:
        e = tensors = None
    if e is None:  # not seen lately: check and plan
        e = _launches.get(check(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens,
                                stacked))
        if tensors is not None:
            _cache.add(scalars, tensors, e)
    p = e.plan
    if p.batch_size == 0:
        return
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # kdtree runs with the current device
            return _run(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)
    stream = _launch.current_stream(index)
    a = e.args()
    k_key = _table_key(k_caches, stacked, index)
    v_key = None if v_caches is None else _table_key(v_caches, stacked, index)
    if (k_key, v_key) not in _checked:  # addresses the plan cache does not cover
        _check_addresses(k_caches, v_caches, stacked)
        with _checked_lock:
            _checked.add((k_key, v_key))
    a.k_caches = _pointer_table("k_caches", k_caches, stacked, index, stream, k_key)
    a.v_caches = None if v_caches is None else _pointer_table("v_caches", v_caches, stacked, index, stream, v_key)
    a.page_table, a.kv_lens, a.node_counts = page_table.data_ptr(), kv_lens.data_ptr(), node_counts.data_ptr()
    a.accepted_path, a.accept_lens, a.stream = accepted_path.data_ptr(), accept_lens.data_ptr(), stream
    status = _lib.api.kv_compact(_launch.runtime(index), _byref(a))  # index is the current device (above)
    if status:
        _lib.check(status, "kdtree_kv_compact")


# k_caches/v_caches are per-layer lists, or (stacked=True) one-element lists holding a
# [num_layers, num_pages, page_size, ...] tensor. An empty v_caches means none (MLA).
lib.define("kv_compact(Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor page_table, Tensor kv_lens, "
           "Tensor node_counts, Tensor accepted_path, Tensor accept_lens, bool stacked=False) -> ()")


def _op(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked=False):
    _run(k_caches, v_caches or None, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)


lib.impl("kv_compact", _op, "CUDA")
lib.impl("kv_compact", _op, "CPU")  # only to reach the checks ('expected a CUDA tensor'); the CPU tests


@torch.library.register_fake("kdtree::kv_compact", lib=lib)
def _(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked=False):
    check(k_caches, v_caches or None, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked,
          require_cuda=False)


def _as_list(name, caches):
    if type(caches) is list:  # the common case first; the list is only read
        return caches, False
    if caches is None:
        return None, None
    if isinstance(caches, torch.Tensor):
        return [caches], True
    if isinstance(caches, (list, tuple)):
        return list(caches), False
    raise TypeError(f"{name}: expected a list of per-layer tensors or one stacked tensor, got {type(caches).__name__}")


def kv_compact(k_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, *, v_caches=None):
    """Moves path entry j (node n_j) of each request from KV position prefix_len + n_j to prefix_len + j in
    every layer's cache, in place (prefix_len = kv_lens[b] - node_counts[b]); the caller then sets
    kv_lens[b] = prefix_len + accept_lens[b] + 1.

    k_caches: a list of per-layer caches [num_pages, page_size, ...] (same shape and dtype, bf16/f16 or
    float8_e4m3fn: rows move as bytes, scales are per cache and do not move), or one
    tensor [num_layers, num_pages, page_size, ...]; v_caches likewise, or None (MLA). page_table [B, M],
    kv_lens, node_counts, accept_lens [B] int32; accepted_path [B, W] int32 (tree_accept's output).
    """
    k_list, stacked = _as_list("k_caches", k_caches)
    v_list, v_stacked = _as_list("v_caches", v_caches)
    if v_list is not None and v_stacked != stacked:
        raise TypeError("v_caches: pass the same form as k_caches (both lists, or both stacked tensors)")
    if type(page_table) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        _run(k_list, v_list, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)
    else:
        # torch's dispatcher would reject a non-tensor without naming it: check here.
        for name, caches in (("k_caches", k_list), ("v_caches", v_list or ())):
            for i, t in enumerate(caches):
                C.tensor(f"{name}[{i}]", t, contiguous=False)
        for name, t in (("page_table", page_table), ("kv_lens", kv_lens), ("node_counts", node_counts),
                        ("accepted_path", accepted_path), ("accept_lens", accept_lens)):
            C.tensor(name, t, contiguous=False)
        torch.ops.kdtree.kv_compact(k_list, v_list or [], page_table, kv_lens, node_counts, accepted_path,
                                    accept_lens, stacked)
