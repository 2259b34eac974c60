"""What kdtree generates, read once from the C library (kdtree_supported_shapes_json, codegen/shapes.cpp).

The package keeps no list of its own: the argument checks, their messages, the DDTree example and the
tests all read this table, so a width or page size added in codegen reaches Python without an edit here.
"""

import json
import threading
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from . import _lib


@dataclass(frozen=True)
class HeadShape:
    """One verify_attention head shape: q/K head dim, V (output) head dim, and whether it is MLA (V is the
    first head_dim_v dims of the K cache; one KV head)."""
    name: str
    head_dim_qk: int
    head_dim_v: int
    mla: bool


@dataclass(frozen=True)
class Grid:
    """The kernel grid `kdtree-gen warm` (and `python -m kdtree warm`) compiles without grid options."""
    heads: Tuple[str, ...]
    widths: Tuple[int, ...]
    page_sizes: Tuple[int, ...]
    dtypes: Tuple[str, ...]
    kv_dtypes: Tuple[str, ...]


# The table's dtype names as torch dtypes (verify_attention's q/caches/out and kv_compact's caches).
_TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass(frozen=True)
class SupportedShapes:
    """kdtree.supported_shapes(): what the C library generates.

    heads       verify_attention head shapes (HeadShape: name, head_dim_qk, head_dim_v, mla)
    widths      max_tree_nodes W every operation takes
    page_sizes  KV page sizes of verify_attention and kv_compact
    dtypes      q / cache / out dtypes of verify_attention and kv_compact, by name ("bf16", "f16")
    kv_dtypes   KV cache types of verify_attention and kv_compact: "as_q" (q's dtype), "e4m3"
                (torch.float8_e4m3fn with k_scale / v_scale)
    archs       GPU architectures ("sm_90", ...)
    default_grid  what `kdtree-gen warm` compiles by default (Grid)
    """
    heads: Tuple[HeadShape, ...]
    widths: Tuple[int, ...]
    page_sizes: Tuple[int, ...]
    dtypes: Tuple[str, ...]
    kv_dtypes: Tuple[str, ...]
    archs: Tuple[str, ...]
    default_grid: Grid

    @property
    def torch_dtypes(self) -> Tuple[torch.dtype, ...]:
        """`dtypes` as torch dtypes."""
        return tuple(_TORCH_DTYPES[d] for d in self.dtypes)

    def head(self, head_dim_qk: int, *, mla: Optional[bool] = None) -> Optional[HeadShape]:
        """The head shape with this q/K head dim (and MLA or not, when given), or None."""
        for h in self.heads:
            if h.head_dim_qk == head_dim_qk and (mla is None or h.mla == mla):
                return h
        return None

    def width_for(self, nodes: int) -> int:
        """The smallest width W that holds `nodes` tree nodes (root included); ValueError if none does."""
        for w in self.widths:
            if nodes <= w:
                return w
        raise ValueError(f"{nodes} tree nodes do not fit the largest tree width {self.widths[-1]}")


def parse(text):
    """A SupportedShapes from kdtree_supported_shapes_json()'s text."""
    d = json.loads(text)
    g = d["default_grid"]
    return SupportedShapes(
        heads=tuple(HeadShape(h["name"], int(h["head_dim_qk"]), int(h["head_dim_v"]), bool(h["mla"]))
                    for h in d["heads"]),
        widths=tuple(d["widths"]), page_sizes=tuple(d["page_sizes"]), dtypes=tuple(d["dtypes"]),
        kv_dtypes=tuple(d["kv_dtypes"]), archs=tuple(d["archs"]),
        default_grid=Grid(tuple(g["heads"]), tuple(g["widths"]), tuple(g["page_sizes"]), tuple(g["dtypes"]),
                          tuple(g["kv_dtypes"])))


_lock = threading.Lock()
_shapes = None


def get():
    """The table (loads libkdtree on first use; then a global read)."""
    s = _shapes
    if s is None:
        with _lock:
            s = _load()
    return s


def _load():
    global _shapes
    if _shapes is None:
        _shapes = parse(_lib.supported_shapes_json())
    return _shapes
