"""ctypes mirror of include/kdtree/kdtree.h (the C ABI). Field order and types follow the header exactly;
tests/python/test_abi_layout.py compares every struct's size and offsets with a C compiler's."""

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p

from . import _loader

# kdtree_status
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_COMPILE = 3
ERROR_CACHE = 4
ERROR_NO_DRIVER = 5
ERROR_NO_DEVICE = 6
ERROR_DRIVER = 7
ERROR_INTERNAL = 8
STATUS_NAMES = {0: "KDTREE_OK", 1: "KDTREE_ERROR_INVALID_ARGUMENT", 2: "KDTREE_ERROR_UNSUPPORTED",
                3: "KDTREE_ERROR_COMPILE", 4: "KDTREE_ERROR_CACHE", 5: "KDTREE_ERROR_NO_DRIVER",
                6: "KDTREE_ERROR_NO_DEVICE", 7: "KDTREE_ERROR_DRIVER", 8: "KDTREE_ERROR_INTERNAL"}

# kdtree_dtype
DTYPE_BF16 = 0
DTYPE_F16 = 1
DTYPE_F32 = 2

# kdtree_kv_dtype
KV_DTYPE_AS_Q = 0
KV_DTYPE_E4M3 = 1

MAX_KV_LEN = 1 << 30  # KDTREE_MAX_KV_LEN

c_enum = c_int  # C enums with these values are int-sized on every ABI kdtree targets


class VerifySpec(ctypes.Structure):
    _fields_ = [("head_dim_qk", c_int), ("head_dim_v", c_int), ("num_q_heads", c_int), ("num_kv_heads", c_int),
                ("page_size", c_int), ("max_tree_nodes", c_int), ("dtype", c_enum), ("kv_dtype", c_enum)]


class VerifyArgs(ctypes.Structure):
    _fields_ = [("spec", VerifySpec), ("batch_size", c_int), ("total_nodes", c_int), ("max_kv_len", c_int),
                ("num_pages", c_int), ("q", c_void_p), ("node_indptr", c_void_p), ("k_cache", c_void_p),
                ("v_cache", c_void_p), ("page_table", c_void_p), ("max_pages_per_req", c_int),
                ("kv_lens", c_void_p), ("tree_mask", c_void_p), ("sm_scale", c_float), ("out", c_void_p),
                ("lse", c_void_p), ("workspace", c_void_p), ("workspace_size", c_size_t),
                ("error_flags", c_void_p), ("stream", c_void_p), ("num_splits", c_int), ("k_scale", c_float),
                ("v_scale", c_float)]


class TreeBuildArgs(ctypes.Structure):
    _fields_ = [("batch_size", c_int), ("depth", c_int), ("top_k", c_int), ("budget", c_int),
                ("max_tree_nodes", c_int), ("draft_tokens", c_void_p), ("draft_logprobs", c_void_p),
                ("root_tokens", c_void_p), ("prefix_lens", c_void_p), ("tokens", c_void_p),
                ("parents", c_void_p), ("depths", c_void_p), ("positions", c_void_p), ("tree_mask", c_void_p),
                ("first_child", c_void_p), ("next_sibling", c_void_p), ("node_counts", c_void_p),
                ("scores", c_void_p), ("stream", c_void_p)]


class TreeAcceptArgs(ctypes.Structure):
    _fields_ = [("batch_size", c_int), ("max_tree_nodes", c_int), ("tokens", c_void_p), ("parents", c_void_p),
                ("node_counts", c_void_p), ("target_tokens", c_void_p), ("node_indptr", c_void_p),
                ("accepted_path", c_void_p), ("accept_lens", c_void_p), ("bonus_tokens", c_void_p),
                ("error_flags", c_void_p), ("stream", c_void_p), ("total_nodes", c_int)]


class TreeAllocateArgs(ctypes.Structure):
    _fields_ = [("batch_size", c_int), ("max_tree_nodes", c_int), ("cap", c_int), ("total", c_int),
                ("scores", c_void_p), ("active", c_void_p), ("remaining", c_void_p), ("urgency", c_float),
                ("node_counts", c_void_p), ("node_indptr", c_void_p), ("row_req", c_void_p), ("row_node", c_void_p),
                ("error_flags", c_void_p), ("stream", c_void_p)]


class SampleArgs(ctypes.Structure):
    _fields_ = [("num_rows", c_int), ("vocab_size", c_int), ("logits_dtype", c_enum), ("logits", c_void_p),
                ("row_stride", c_int64), ("temperature", c_float), ("seed", c_uint64), ("row_offsets", c_void_p),
                ("out_tokens", c_void_p), ("stream", c_void_p)]


class KvCompactArgs(ctypes.Structure):
    _fields_ = [("num_layers", c_int), ("batch_size", c_int), ("max_tree_nodes", c_int), ("page_size", c_int),
                ("num_pages", c_int), ("row_elems_k", c_int), ("row_elems_v", c_int), ("dtype", c_enum),
                ("k_caches", c_void_p), ("v_caches", c_void_p), ("page_table", c_void_p),
                ("max_pages_per_req", c_int), ("kv_lens", c_void_p), ("node_counts", c_void_p),
                ("accepted_path", c_void_p), ("accept_lens", c_void_p), ("error_flags", c_void_p),
                ("stream", c_void_p), ("kv_dtype", c_enum)]


STRUCTS = {"kdtree_verify_spec": VerifySpec, "kdtree_verify_args": VerifyArgs,
           "kdtree_tree_build_args": TreeBuildArgs, "kdtree_tree_accept_args": TreeAcceptArgs,
           "kdtree_tree_allocate_args": TreeAllocateArgs,
           "kdtree_sample_args": SampleArgs, "kdtree_kv_compact_args": KvCompactArgs}

_PROTOTYPES = {
    "kdtree_version": (c_char_p, []),
    "kdtree_supported_shapes_json": (c_char_p, []),
    "kdtree_last_error": (c_char_p, []),
    "kdtree_runtime_create": (c_int, [c_int, c_char_p, POINTER(c_void_p)]),
    "kdtree_runtime_create_offline": (c_int, [c_int, c_char_p, POINTER(c_void_p)]),
    "kdtree_runtime_destroy": (c_int, [c_void_p]),
    "kdtree_runtime_bind_context": (c_int, [c_void_p]),
    "kdtree_runtime_arch": (c_int, [c_void_p, POINTER(c_int)]),
    "kdtree_verify_workspace_size": (c_int, [c_void_p, POINTER(VerifySpec), c_int, c_int, c_int, POINTER(c_size_t)]),
    "kdtree_verify_attention": (c_int, [c_void_p, POINTER(VerifyArgs)]),
    "kdtree_warm": (c_int, [c_void_p, POINTER(VerifySpec)]),
    "kdtree_tree_build": (c_int, [c_void_p, POINTER(TreeBuildArgs)]),
    "kdtree_tree_accept": (c_int, [c_void_p, POINTER(TreeAcceptArgs)]),
    "kdtree_tree_allocate": (c_int, [c_void_p, POINTER(TreeAllocateArgs)]),
    "kdtree_sample_tokens": (c_int, [c_void_p, POINTER(SampleArgs)]),
    "kdtree_kv_compact": (c_int, [c_void_p, POINTER(KvCompactArgs)]),
}


class Error(RuntimeError):
    """A failing kdtree C call: `status` is the kdtree_status code, `message` is kdtree_last_error()."""

    def __init__(self, status, message, call=""):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, f"status {self.status}")
        self.message = message
        self.call = call
        # kdtree_last_error() already starts with the C function's name: say it once.
        prefix = f"{call}: " if call and not message.startswith(f"{call}:") else ""
        super().__init__(f"{prefix}{message} ({self.status_name})")


class _Api:
    """The C functions with their prototypes, loaded on first attribute access."""

    def __init__(self):
        self._funcs = None

    def _load(self):
        lib = _loader.load()
        funcs = {}
        for name, (restype, argtypes) in _PROTOTYPES.items():
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = argtypes
            funcs[name] = f
        self._funcs = funcs

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._funcs is None:
            self._load()
        try:
            f = self._funcs["kdtree_" + name]
        except KeyError:
            raise AttributeError(name) from None
        setattr(self, name, f)  # later lookups skip __getattr__
        return f


api = _Api()
_api = api  # the real library, for facts (version, shapes): the CPU tests and benchmark replace `api` only


def last_error():
    return api.last_error().decode("utf-8", "replace")


def check(status, call):
    """Raises kdtree.Error for a non-OK status, with kdtree_last_error() of this thread."""
    if status != OK:
        raise Error(status, last_error(), call)


def version():
    return _api.version().decode()


def supported_shapes_json():
    """kdtree_supported_shapes_json(): the library's table of what it generates (see kdtree.h)."""
    return _api.supported_shapes_json().decode()
