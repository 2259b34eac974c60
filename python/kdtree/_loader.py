"""Finds and loads libkdtree.so (shipped in kdtree/_native/) and the NVRTC it links.

libkdtree links libnvrtc.so.<major> of the toolkit it was built with. That library comes either from a
CUDA toolkit (/usr/local/cuda, $CUDA_HOME) or from the nvidia-*-nvrtc wheel that PyTorch's CUDA build
installs under site-packages/nvidia/. The dynamic loader would only find the toolkit's through the
RPATH, so NVRTC is located here and loaded first: a library already loaded under its SONAME satisfies
libkdtree's dependency. libnvrtc-builtins (which NVRTC dlopens by name when it compiles) is preloaded
from the same directory for the same reason.
"""

import ctypes
import glob
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE_DIR = os.path.join(_HERE, "_native")


class LoadError(ImportError):
    """libkdtree or NVRTC could not be loaded; the message says what was tried."""


def build_info():
    """The facts CMake recorded (kdtree/_native/_build_info.py), or defaults for a source checkout."""
    info = {"VERSION": "unknown", "NVRTC_SONAME": "libnvrtc.so.13", "CUDA_VERSION": "unknown",
            "CUDA_LIBRARY_DIR": "/usr/local/cuda/lib64"}
    path = os.path.join(NATIVE_DIR, "_build_info.py")
    if os.path.exists(path):
        scope = {}
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), scope)
        info.update({k: v for k, v in scope.items() if k in info})
    return info


def library_path():
    """$KDTREE_LIBRARY if set (e.g. a development build's build/libkdtree.so), else the shipped one."""
    env = os.environ.get("KDTREE_LIBRARY")
    if env:
        return env
    return os.path.join(NATIVE_DIR, "libkdtree.so")


def kdtree_gen_path():
    """The kdtree-gen executable shipped next to libkdtree ($KDTREE_GEN overrides it)."""
    return os.environ.get("KDTREE_GEN") or os.path.join(NATIVE_DIR, "kdtree-gen")


def _nvrtc_candidates(soname):
    """Directories that may hold `soname`, most specific first."""
    dirs = []
    # torch's CUDA wheels: site-packages/nvidia/<pkg>/lib (CUDA 12: cuda_nvrtc; CUDA 13: cu13).
    for root in sys.path:
        if root and os.path.isdir(os.path.join(root, "nvidia")):
            dirs.extend(sorted(os.path.dirname(p) for p in glob.glob(os.path.join(root, "nvidia", "*", "lib", soname))))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "lib64"))
    dirs.append(build_info()["CUDA_LIBRARY_DIR"])
    dirs.append("/usr/local/cuda/lib64")
    dirs.extend(sorted(glob.glob("/usr/local/cuda-*/lib64"), reverse=True))
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.exists(os.path.join(d, soname)):
            seen.add(d)
            out.append(d)
    return out


_nvrtc_dir = None


def nvrtc_dir():
    """The directory NVRTC was loaded from by the package (None when the dynamic loader found it)."""
    return _nvrtc_dir


def loaded_nvrtc_path():
    """The NVRTC library mapped into this process (from /proc/self/maps), or None."""
    soname = build_info()["NVRTC_SONAME"]
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith(soname):
                    return path
    except OSError:
        pass
    return None


def nvrtc_version(path=None):
    """"MAJOR.MINOR" of the NVRTC loaded in this process (or of `path`), or None if it cannot be asked."""
    path = path or loaded_nvrtc_path()
    if not path:
        return None
    try:
        lib = ctypes.CDLL(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{major.value}.{minor.value}"


def _load_nvrtc():
    global _nvrtc_dir
    soname = build_info()["NVRTC_SONAME"]
    # Already loaded by the process, on LD_LIBRARY_PATH or in the ld.so cache: the loader finds it.
    try:
        ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    tried = _nvrtc_candidates(soname)
    for d in tried:
        try:
            ctypes.CDLL(os.path.join(d, soname), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        for builtins in sorted(glob.glob(os.path.join(d, "libnvrtc-builtins.so.*"))):
            try:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
        _nvrtc_dir = d
        return
    raise LoadError(
        f"kdtree needs NVRTC ({soname}) at run time and found none: not on the loader's path, not under "
        f"site-packages/nvidia/*/lib (PyPI's nvidia-cuda-nvrtc wheel, which torch's CUDA build installs), "
        f"not in $CUDA_HOME/lib64 or /usr/local/cuda/lib64. Install a CUDA toolkit of the same major "
        f"version or that wheel, or set LD_LIBRARY_PATH.")


_lib = None


def load():
    """Loads NVRTC, then libkdtree; returns the ctypes handle (once per process)."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise LoadError(f"libkdtree not found at {path}: install the package with `pip install .` from the "
                        f"repository root, or point $KDTREE_LIBRARY at a built libkdtree.so")
    _load_nvrtc()
    try:
        _lib = ctypes.CDLL(path)
    except OSError as e:
        raise LoadError(f"could not load {path}: {e}") from e
    return _lib
