"""python -m kdtree warm|emit|info|cache ...: the shipped kdtree-gen, with the NVRTC the package found.

`warm`, `emit` and `cache` are exactly `kdtree-gen`'s (same cubin cache, same KDTREE_CACHE_DIR /
XDG_CACHE_HOME rules, same flags). `info` prints kdtree-gen's info and then what the Python package uses.
"""

import os
import subprocess
import sys

from . import _loader

USAGE = """usage: python -m kdtree COMMAND [ARGS...]
  warm [--arch sm_120|sm_90|sm_80|native] [--heads ...] [--widths ...] [--pages ...] [--dtypes ...] ...
  emit [--op ...] ...        print a kernel's generated CUDA source
  info                       versions, devices, the cache, and the Python package's libraries
  cache list|clear|verify|prune   the cubin cache
Every command and flag is kdtree-gen's (`python -m kdtree warm --help`)."""


def run_kdtree_gen(argv):
    exe = _loader.kdtree_gen_path()
    if not os.path.exists(exe):
        print(f"kdtree: kdtree-gen not found at {exe} (set KDTREE_GEN or reinstall the package)", file=sys.stderr)
        return 2
    _loader._load_nvrtc()  # finds NVRTC the way the package does; raises LoadError if there is none
    env = dict(os.environ)
    if _loader.nvrtc_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (_loader.nvrtc_dir(), env.get("LD_LIBRARY_PATH")) if p)
    sys.stdout.flush()
    return subprocess.call([exe, *argv], env=env)


def _python_info():
    info = _loader.build_info()
    print(f"python package: {os.path.dirname(os.path.abspath(__file__))}")
    print(f"libkdtree: {_loader.library_path()} (built with CUDA {info['CUDA_VERSION']})")
    print(f"nvrtc: {_loader.loaded_nvrtc_path() or info['NVRTC_SONAME'] + ' (not loaded)'}")
    try:
        import torch
        cuda = torch.cuda.is_available()
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{torch.cuda.device_count() if cuda else 0} GPU(s) visible to torch")
    except ImportError:
        print("torch: not installed (the operators need it)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    try:
        status = run_kdtree_gen(argv)
        if argv[0] == "info" and status == 0:
            _python_info()
    except _loader.LoadError as e:
        print(f"kdtree: {e}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
