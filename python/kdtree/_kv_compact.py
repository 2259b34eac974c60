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
from typing import List

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._plan_cache import PlanCache

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}


_T = torch.Tensor
_DTYPE_KEYS = tuple(_DTYPES)


def _same_layers(caches):
    """Every layer a plain contiguous tensor with the first one's shape, dtype and device: the common case,
    tested in one cheap pass (a model has tens of layers and this runs on every call)."""
    first = caches[0]
    if type(first) is not _T:
        return False
    shape, dtype, device, cuda = first.shape, first.dtype, first.get_device(), first.is_cuda
    for t in caches:
        if (type(t) is not _T or t.shape != shape or t.dtype != dtype or t.get_device() != device
                or t.is_cuda is not cuda or not t.is_contiguous()):
            return False
    return True


def _layers(name, caches, stacked):
    """The per-layer [num_pages, page_size, ...] geometry of a cache list or a stacked tensor."""
    if stacked:
        if len(caches) != 1:
            raise ValueError(f"{name}: the stacked form is one tensor [num_layers, num_pages, page_size, ...]")
        t = C.tensor(name, caches[0], dtypes=_DTYPE_KEYS)
        if t.dim() < 4:
            raise ValueError(f"{name}: expected [num_layers, num_pages, page_size, ...] (4 or more dimensions), "
                             f"got shape {list(t.shape)}")
        C.contiguous(name, t)
        return t.shape[0], tuple(t.shape[1:]), t.dtype
    if len(caches) == 0:
        raise ValueError(f"{name}: expected at least one layer's cache")
    if _same_layers(caches):  # then the first layer's checks stand for all
        t = C.tensor(f"{name}[0]", caches[0], dtypes=_DTYPE_KEYS)
        if len(t.shape) >= 3:
            return len(caches), tuple(t.shape), t.dtype
    first = None
    for i, t in enumerate(caches):
        n = f"{name}[{i}]"
        C.tensor(n, t, dtypes=_DTYPE_KEYS)
        if t.dim() < 3:
            raise ValueError(f"{n}: expected [num_pages, page_size, ...] (3 or more dimensions), got shape "
                             f"{list(t.shape)}")
        C.contiguous(n, t)
        if first is None:
            first = t
        elif t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{n}: shape {list(t.shape)} {C._dtype_name(t.dtype)} on {t.device} differs from "
                             f"{name}[0]'s {list(first.shape)} {C._dtype_name(first.dtype)} on {first.device}; "
                             f"every layer must match")
    return len(caches), tuple(first.shape), first.dtype


def plan(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked,
         require_cuda=True):
    num_layers, k_geom, dtype = _layers("k_caches", k_caches, stacked)
    num_pages, page_size = k_geom[0], k_geom[1]
    C.one_of("k_caches page size", page_size, C.PAGE_SIZES, "page size")
    row_k = math.prod(k_geom[2:])
    row_v = 0
    if v_caches is not None:
        v_layers, v_geom, v_dtype = _layers("v_caches", v_caches, stacked)
        if v_layers != num_layers or v_geom[:2] != k_geom[:2] or v_dtype != dtype:
            raise ValueError(f"v_caches: {v_layers} layers of {list(v_geom)} {C._dtype_name(v_dtype)} do not "
                             f"match k_caches' {num_layers} layers of {list(k_geom)} {C._dtype_name(dtype)} "
                             f"(layers, pages, page size and dtype must agree)")
        row_v = math.prod(v_geom[2:])
    for name, row in (("k_caches", row_k), ("v_caches", row_v)):
        if row % 8 != 0:
            raise ValueError(f"{name}: a token row holds {row} elements; kv_compact needs a multiple of 8 "
                             f"(rows move as 16-byte vectors)")
        C.int32_range(f"{name} row elements", row)
    C.tensor("page_table", page_table, dtypes=(torch.int32,), ndim=2)
    C.contiguous("page_table", page_table)
    batch, max_pages = page_table.shape
    for name, t in (("kv_lens", kv_lens), ("node_counts", node_counts), ("accept_lens", accept_lens)):
        C.tensor(name, t, dtypes=(torch.int32,), ndim=1)
        C.shape(name, t, (batch,))
        C.contiguous(name, t)
    C.tensor("accepted_path", accepted_path, dtypes=(torch.int32,), ndim=2)
    C.contiguous("accepted_path", accepted_path)
    if accepted_path.shape[0] != batch:
        raise ValueError(f"accepted_path: expected shape [{batch}, W], got {list(accepted_path.shape)}")
    w = accepted_path.shape[1]
    C.one_of("accepted_path.shape[1] (max_tree_nodes)", w, C.TREE_WIDTHS, "tree width")
    named = [("k_caches", k_caches[0]), ("v_caches", None if v_caches is None else v_caches[0]),
             ("page_table", page_table), ("kv_lens", kv_lens), ("node_counts", node_counts),
             ("accepted_path", accepted_path), ("accept_lens", accept_lens)]
    device = C.same_device(named) if require_cuda else page_table.device
    return num_layers, num_pages, page_size, row_k, row_v, _DTYPES[dtype], batch, max_pages, w, device


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


def _pointer_table(name, caches, stacked, index, stream):
    """The device address of the table of per-layer cache addresses."""
    if stacked:
        t = caches[0]
        base, layers, stride = t.data_ptr(), t.shape[0], t.stride(0) * t.element_size()
        key = (index, "stacked", base, layers, stride)
    else:
        ptrs = tuple(map(_T.data_ptr, caches))
        key = (index, ptrs)
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
        host = torch.tensor(ptrs, dtype=torch.int64).pin_memory()
        table = torch.empty(len(ptrs), dtype=torch.int64, device=device)
        table.copy_(host, non_blocking=True)
        entry = _Table(table, host, stream)
    with _tables_lock:
        return _tables.setdefault(key, entry).ptr


_I32 = torch.int32
_PAGE_SET = frozenset(C.PAGE_SIZES)
_WIDTH_SET = frozenset(C.TREE_WIDTHS)
_Args = _lib.KvCompactArgs


def _fast_geometry(caches, stacked, cuda, index):
    """(layers, shape of one layer, dtype, token row elements) of plain contiguous caches on the device, whose
    geometry kv_compact takes, or None."""
    first = caches[0]
    if type(first) is not _T or first.is_cuda is not cuda or first.get_device() != index:
        return None
    shape = first.shape
    if stacked:
        if len(caches) != 1 or len(shape) < 4 or shape[0] == 0 or not first.is_contiguous():
            return None
        layers, shape = shape[0], shape[1:]
    else:
        if len(shape) < 3 or not _same_layers(caches):
            return None
        layers = len(caches)
    dtype = first.dtype
    pages_x_page = shape[0] * shape[1]
    if dtype not in _DTYPES or shape[1] not in _PAGE_SET or pages_x_page == 0:
        return None
    row = first.numel() // (layers * pages_x_page) if stacked else first.numel() // pages_x_page
    if row % 8 or row > C.INT32_MAX:
        return None
    return layers, shape, dtype, row


def _fast_plan(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked):
    """The common case in one pass of cheap tests: what plan() returns (with the device index for the
    device), or None; then plan() (the authority, which names what is wrong) decides. Accepts nothing
    that plan() rejects."""
    if (type(page_table) is not _T or type(kv_lens) is not _T or type(node_counts) is not _T
            or type(accepted_path) is not _T or type(accept_lens) is not _T or not k_caches):
        return None
    cuda = page_table.is_cuda
    if not cuda and not C.accept_cpu(page_table, kv_lens, node_counts, accepted_path, accept_lens, *k_caches,
                                     *(v_caches or ())):
        return None
    index = page_table.get_device()
    k = _fast_geometry(k_caches, stacked, cuda, index)
    if k is None:
        return None
    layers, shape, dtype, row_k = k
    row_v = 0
    if v_caches is not None:
        v = _fast_geometry(v_caches, stacked, cuda, index) if v_caches else None
        if v is None or v[0] != layers or v[1][:2] != shape[:2] or v[2] is not dtype:
            return None
        row_v = v[3]
    ps, aps = page_table.shape, accepted_path.shape
    if (len(ps) != 2 or len(aps) != 2 or page_table.dtype is not _I32 or kv_lens.dtype is not _I32
            or node_counts.dtype is not _I32 or accepted_path.dtype is not _I32 or accept_lens.dtype is not _I32):
        return None
    b, m = ps
    b1 = (b,)
    if (kv_lens.shape != b1 or node_counts.shape != b1 or accept_lens.shape != b1 or aps[0] != b
            or aps[1] not in _WIDTH_SET or not page_table.is_contiguous() or not kv_lens.is_contiguous()
            or not node_counts.is_contiguous() or not accepted_path.is_contiguous()
            or not accept_lens.is_contiguous()):
        return None
    if (kv_lens.get_device() != index or node_counts.get_device() != index or accepted_path.get_device() != index
            or accept_lens.get_device() != index or kv_lens.is_cuda is not cuda or node_counts.is_cuda is not cuda
            or accepted_path.is_cuda is not cuda or accept_lens.is_cuda is not cuda):
        return None
    return layers, shape[0], shape[1], row_k, row_v, _DTYPES[dtype], b, m, aps[1], index


_cache = PlanCache()  # (scalars, tensors) -> what plan() returns, with the device index for the device


def _run(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked):
    if type(k_caches) is list and (v_caches is None or type(v_caches) is list):
        tensors = (page_table, kv_lens, node_counts, accepted_path, accept_lens, *k_caches, *(v_caches or ()))
        scalars = (stacked, len(k_caches), None if v_caches is None else len(v_caches))
        f = _cache.find(scalars, tensors)
    else:
        f = tensors = None
    if f is None:  # not seen lately: the quick test, else the full checks (which name what is wrong)
        f = _fast_plan(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)
        if f is None:
            f = plan(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)
            device = f[-1]
            f = f[:-1] + (C.device_index(device),)
        if tensors is not None:
            _cache.add(scalars, tensors, f)
    (num_layers, num_pages, page_size, row_k, row_v, dtype, batch, max_pages, w, index) = f
    if batch == 0:
        return
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # kdtree runs with the current device
            return _run(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)
    stream = _launch.current_stream(index)
    k_table = _pointer_table("k_caches", k_caches, stacked, index, stream)
    a = _Args(num_layers, batch, w, page_size, num_pages, row_k, row_v, dtype, k_table)
    if v_caches is not None:
        a.v_caches = _pointer_table("v_caches", v_caches, stacked, index, stream)
    a.page_table, a.max_pages_per_req = page_table.data_ptr(), max_pages
    a.kv_lens, a.node_counts = kv_lens.data_ptr(), node_counts.data_ptr()
    a.accepted_path, a.accept_lens = accepted_path.data_ptr(), accept_lens.data_ptr()
    a.stream = stream
    status = _launch.call(_lib.api.kv_compact, index, a)
    if status:
        _lib.check(status, "kdtree_kv_compact")


@torch.library.custom_op("kdtree::kv_compact", mutates_args=("k_caches", "v_caches"))
def kv_compact_op(k_caches: List[torch.Tensor], v_caches: List[torch.Tensor], page_table: torch.Tensor,
                  kv_lens: torch.Tensor, node_counts: torch.Tensor, accepted_path: torch.Tensor,
                  accept_lens: torch.Tensor, stacked: bool = False) -> None:
    """The operator: k_caches/v_caches are per-layer lists, or (stacked=True) one-element lists holding a
    [num_layers, num_pages, page_size, ...] tensor. An empty v_caches means none (MLA): torch 2.11's schema
    inference takes no Optional[List[Tensor]]."""
    _run(k_caches, v_caches or None, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked)


@kv_compact_op.register_fake
def _(k_caches, v_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked=False):
    plan(k_caches, v_caches or None, page_table, kv_lens, node_counts, accepted_path, accept_lens, stacked,
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

    k_caches: a list of per-layer caches [num_pages, page_size, ...] (same shape and dtype, bf16/f16), or one
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
        torch.ops.kdtree.kv_compact(k_list, v_list or [], page_table, kv_lens, node_counts, accepted_path,
                                    accept_lens, stacked)
