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


def kdtree_gen_env():
    """The environment kdtree-gen runs in: the directory of the NVRTC this process loaded first on
    LD_LIBRARY_PATH (kdtree-gen has a RUNPATH, which LD_LIBRARY_PATH overrides). That is the library
    actually mapped, not only one the package found itself: NVRTC loaded before (e.g. torch's, from its
    nvidia wheels) is what the package compiles with, and kdtree-gen must compile with the same one, or it
    warms cache entries the package never reads."""
    _loader._load_nvrtc()  # finds NVRTC the way the package does; raises LoadError if there is none
    env = dict(os.environ)
    loaded = _loader.loaded_nvrtc_path()
    nvrtc_dir = os.path.dirname(os.path.realpath(loaded)) if loaded else _loader.nvrtc_dir()
    if nvrtc_dir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (nvrtc_dir, env.get("LD_LIBRARY_PATH")) if p)
    return env


def run_kdtree_gen(argv, capture=False):
    """Runs kdtree-gen with `argv`: its exit status, or (status, stdout) with capture=True (stdout is
    still printed)."""
    exe = _loader.kdtree_gen_path()
    if not os.path.exists(exe):
        print(f"kdtree: kdtree-gen not found at {exe} (set KDTREE_GEN or reinstall the package)", file=sys.stderr)
        return (2, "") if capture else 2
    env = kdtree_gen_env()
    sys.stdout.flush()
    if not capture:
        return subprocess.call([exe, *argv], env=env)
    r = subprocess.run([exe, *argv], env=env, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(r.stdout)
    return r.returncode, r.stdout


def _kdtree_gen_nvrtc(info_text):
    """The NVRTC version in kdtree-gen info's "NVRTC:   13.0 (path)" line, or None."""
    for line in info_text.splitlines():
        if line.startswith("NVRTC:"):
            fields = line.split()
            return fields[1] if len(fields) > 1 else None
    return None


def _python_info(gen_nvrtc=None):
    info = _loader.build_info()
    print(f"python package: {os.path.dirname(os.path.abspath(__file__))}")
    print(f"libkdtree: {_loader.library_path()} (built with CUDA {info['CUDA_VERSION']})")
    loaded = _loader.loaded_nvrtc_path()
    version = _loader.nvrtc_version(loaded) if loaded else None
    print(f"nvrtc: {version + ' ' if version else ''}{loaded or info['NVRTC_SONAME'] + ' (not loaded)'}")
    if gen_nvrtc and version and gen_nvrtc != version:
        # Two NVRTCs: each compiles and caches its own entries, so warming helps only one of them.
        print(f"nvrtc: kdtree-gen uses NVRTC {gen_nvrtc}, the package NVRTC {version}: their cache entries "
              f"differ (warm with `python -m kdtree warm` to fill the package's)")
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
        if argv[0] == "info" and "--json" not in argv and "--help" not in argv and "-h" not in argv:
            status, out = run_kdtree_gen(argv, capture=True)
            if status == 0:
                _python_info(_kdtree_gen_nvrtc(out))
            return status
        status = run_kdtree_gen(argv)
        if argv[0] == "info" and status == 0:
            _python_info()
    except _loader.LoadError as e:
        print(f"kdtree: {e}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
