"""One kdtree runtime per CUDA device, created on first use and destroyed at interpreter exit.

The runtime binds the device's primary context, which is the context PyTorch uses, so device pointers of
torch tensors and torch's streams are valid for kdtree's launches.
"""

import atexit
import ctypes
import threading

from . import _lib

_lock = threading.Lock()
_runtimes = {}  # device index -> c_void_p handle


def get(device_index):
    """The runtime handle (an int) for CUDA device `device_index`."""
    rt = _runtimes.get(device_index)
    if rt is not None:
        return rt
    with _lock:
        rt = _runtimes.get(device_index)
        if rt is None:
            handle = ctypes.c_void_p()
            _lib.check(_lib.api.runtime_create(device_index, None, ctypes.byref(handle)), "kdtree_runtime_create")
            try:
                _lib.check(_lib.api.runtime_bind_context(handle), "kdtree_runtime_bind_context")
            except _lib.Error:
                _lib.api.runtime_destroy(handle)
                raise
            rt = handle.value
            _runtimes[device_index] = rt
    return rt


def arch(device_index):
    sm = ctypes.c_int()
    _lib.check(_lib.api.runtime_arch(get(device_index), ctypes.byref(sm)), "kdtree_runtime_arch")
    return sm.value


@atexit.register
def _destroy_all():
    with _lock:
        for rt in _runtimes.values():
            _lib.api.runtime_destroy(rt)
        _runtimes.clear()
