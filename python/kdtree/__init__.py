"""kdtree: speculative-decoding tree verification kernels as PyTorch operators.

Every operation is a torch.library operator in the `kdtree` namespace (torch.ops.kdtree.<name>, with a
fake implementation for torch.compile) and a plain function here that checks its arguments, allocates
its outputs and runs on torch's current stream of the tensors' device. See README.md ("Python").
"""

from ._lib import Error
from ._loader import LoadError
from ._shapes import HeadShape, SupportedShapes
from ._kv_compact import kv_compact
from ._sample_tokens import sample_tokens
from ._tree_accept import tree_accept
from ._tree_allocate import tree_allocate
from ._tree_build import TreeBuildResult, tree_build
from ._verify_attention import verify_attention

__all__ = ["Error", "HeadShape", "LoadError", "SupportedShapes", "TreeBuildResult", "__version__", "kv_compact",
           "library_version", "sample_tokens", "supported_shapes", "tree_accept", "tree_allocate", "tree_build", "verify_attention",
           "verify_workspace_size", "warm"]


def __getattr__(name):
    # __version__ is libkdtree's kdtree_version(), read on first access: importing kdtree loads no library.
    if name == "__version__":
        v = library_version()
        globals()["__version__"] = v
        return v
    raise AttributeError(f"module 'kdtree' has no attribute {name!r}")


def library_version():
    """libkdtree's version string (loads the library)."""
    from . import _lib
    return _lib.version()


def supported_shapes():
    """What kdtree generates: a frozen SupportedShapes read once from libkdtree (kdtree_supported_shapes_json):
    heads (HeadShape: name, head_dim_qk, head_dim_v, mla), widths, page_sizes, dtypes ("bf16", "f16"),
    archs ("sm_90", ...) and default_grid (what `python -m kdtree warm` compiles by default). The package's
    checks use the same table. Loads the library."""
    from . import _shapes
    return _shapes.get()


def verify_workspace_size(q, k_cache, page_table, kv_lens, node_indptr, tree_mask, *, max_tree_nodes,
                          v_cache=None, max_kv_len=None):
    """Bytes of workspace verify_attention needs for these arguments (the package manages it; this is for
    capacity planning)."""
    from . import _launch
    from . import _verify_attention as va
    p = va.check(q, k_cache, v_cache, page_table, kv_lens, node_indptr, tree_mask, max_tree_nodes,
                 max_kv_len=max_kv_len)
    with _launch.device_guard(p.device):  # creating the device's runtime binds its context
        return va.workspace_size(p)


def warm(*args):
    """Runs `kdtree-gen warm ARGS...` (the shipped binary): compiles a kernel grid into the cubin cache.
    Returns its exit status."""
    from .__main__ import run_kdtree_gen
    return run_kdtree_gen(["warm", *args])
