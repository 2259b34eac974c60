"""CPU: the installed package imports, loads libkdtree (without libfmt), and its CLI works."""

import os
import subprocess
import sys

import pytest
import torch

import kdtree
from kdtree import _lib, _loader


def test_import_and_library_version():
    assert kdtree.library_version() == _loader.build_info()["VERSION"] or _loader.build_info()["VERSION"] == "unknown"
    assert kdtree.library_version().count(".") == 2


def test_every_operator_is_registered_in_the_kdtree_namespace():
    for name in ("verify_attention", "tree_build", "tree_accept", "sample_tokens", "kv_compact"):
        assert hasattr(torch.ops.kdtree, name), name


def test_shipped_library_needs_no_fmt():
    path = _loader.library_path()
    if os.environ.get("KDTREE_LIBRARY"):
        pytest.skip("KDTREE_LIBRARY points at a development build, not the shipped library")
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("readelf is not available")
    needed = [line for line in out.stdout.splitlines() if "NEEDED" in line]
    assert needed, out.stdout
    assert not any("fmt" in line for line in needed), needed


def test_nvrtc_is_loaded_from_a_findable_place():
    kdtree.library_version()  # loads NVRTC, then libkdtree
    path = _loader.loaded_nvrtc_path()
    assert path is not None and os.path.exists(path)


def test_failing_c_call_raises_kdtree_error_with_status_and_message():
    # An offline runtime validates arguments before touching a device: a NULL tokens pointer is
    # KDTREE_ERROR_INVALID_ARGUMENT with kdtree_last_error() naming the field.
    import ctypes
    rt = ctypes.c_void_p()
    _lib.check(_lib.api.runtime_create_offline(90, None, ctypes.byref(rt)), "kdtree_runtime_create_offline")
    try:
        a = _lib.TreeAcceptArgs(batch_size=1, max_tree_nodes=16)
        with pytest.raises(kdtree.Error) as e:
            _lib.check(_lib.api.tree_accept(rt, ctypes.byref(a)), "kdtree_tree_accept")
        assert e.value.status == _lib.ERROR_INVALID_ARGUMENT
        assert "tokens" in e.value.message
        assert "kdtree_tree_accept" in str(e.value) and "KDTREE_ERROR_INVALID_ARGUMENT" in str(e.value)
        assert isinstance(e.value, RuntimeError)
    finally:
        _lib.api.runtime_destroy(rt)


def test_no_driver_is_a_kdtree_error_not_a_crash():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-driver path cannot be exercised")
    from kdtree import _runtime
    try:
        _runtime.arch(0)
    except kdtree.Error as e:
        assert e.status in (_lib.ERROR_NO_DRIVER, _lib.ERROR_NO_DEVICE), e
        assert e.message
    else:
        pytest.skip("a CUDA driver is loadable here although torch sees no GPU")


def _python_m(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kdtree", *args], capture_output=True, text=True, env=env)


def test_python_m_kdtree_help_and_bad_usage():
    assert _python_m("--help").returncode == 0
    r = _python_m()
    assert r.returncode == 2 and "usage" in r.stdout
    r = _python_m("no-such-command")
    assert r.returncode != 0


def test_python_m_kdtree_warm_fills_the_given_cache(tmp_path):
    # Tree ops only, one width: a few NVRTC compiles, no GPU needed (sm_90 is the H200's arch).
    cache = tmp_path / "cache"
    r = _python_m("warm", "--arch", "sm_90", "--no-attention", "--widths", "16", "--pages", "16",
                  "--cache-dir", str(cache), "-j", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout, r.stdout
    assert any(cache.iterdir())
    # The second run reuses every kernel: the same cache as kdtree-gen's.
    r = _python_m("warm", "--arch", "sm_90", "--no-attention", "--widths", "16", "--pages", "16",
                  "--cache-dir", str(cache), "-j", "2")
    assert r.returncode == 0 and ": 0 compiled," in r.stdout, r.stdout


def test_python_m_kdtree_warm_honours_KDTREE_CACHE_DIR(tmp_path):
    env = dict(os.environ, KDTREE_CACHE_DIR=str(tmp_path / "envcache"))
    r = _python_m("info", env=env)
    assert r.returncode == 0, r.stderr
    assert str(tmp_path / "envcache") in r.stdout
    assert "libkdtree:" in r.stdout and "nvrtc:" in r.stdout


def test_nvrtc_search_prefers_torch_nvidia_wheels_then_the_toolkit(tmp_path, monkeypatch):
    soname = _loader.build_info()["NVRTC_SONAME"]
    wheel_lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    wheel_lib.mkdir(parents=True)
    (wheel_lib / soname).write_bytes(b"")
    home = tmp_path / "cuda"
    (home / "lib64").mkdir(parents=True)
    (home / "lib64" / soname).write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")] + sys.path)
    monkeypatch.setenv("CUDA_HOME", str(home))
    found = _loader._nvrtc_candidates(soname)
    assert found[0] == str(wheel_lib)
    toolkit = found.index(str(home / "lib64"))
    assert all("/nvidia/" in d for d in found[:toolkit])  # every torch wheel directory before any toolkit


def test_missing_library_is_a_load_error_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("KDTREE_LIBRARY", str(tmp_path / "nope.so"))
    monkeypatch.setattr(_loader, "_lib", None)
    with pytest.raises(kdtree.LoadError, match="libkdtree not found at .*pip install"):
        _loader.load()


def test_version_is_the_library_version():
    assert kdtree.__version__ == kdtree.library_version()
    assert "__version__" in kdtree.__all__


def test_supported_shapes_is_the_library_table_and_frozen():
    import dataclasses
    import json
    s = kdtree.supported_shapes()
    assert s is kdtree.supported_shapes()  # read once
    table = json.loads(_lib.supported_shapes_json())
    assert list(s.widths) == table["widths"] and list(s.page_sizes) == table["page_sizes"]
    assert [h.name for h in s.heads] == [h["name"] for h in table["heads"]]
    assert any(h.mla for h in s.heads) and s.head(576, mla=True).head_dim_v == 512
    assert s.torch_dtypes == tuple({"bf16": torch.bfloat16, "f16": torch.float16}[d] for d in s.dtypes)
    assert s.width_for(1) == s.widths[0] and s.width_for(s.widths[-1]) == s.widths[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.widths = (8,)
    gen = _loader.kdtree_gen_path()
    if os.path.exists(gen):  # the CLI exports the same table
        r = subprocess.run([gen, "info", "--json"], capture_output=True, text=True)
        if r.returncode == 0:
            assert json.loads(r.stdout)["supported"] == table


def test_python_m_kdtree_help_lists_every_cache_action():
    r = _python_m("--help")
    assert "cache list|clear|verify|prune" in r.stdout, r.stdout


def test_error_message_names_the_call_once():
    # kdtree_last_error() already starts with the C function's name (issue 15).
    e = kdtree.Error(_lib.ERROR_NO_DRIVER, "kdtree_runtime_bind_context: the CUDA driver could not be loaded",
                     "kdtree_runtime_bind_context")
    assert str(e).count("kdtree_runtime_bind_context") == 1, str(e)
    e = kdtree.Error(_lib.ERROR_NO_DRIVER, "no driver", "kdtree_runtime_arch")
    assert str(e).startswith("kdtree_runtime_arch: no driver"), str(e)


def test_kdtree_gen_runs_on_the_nvrtc_loaded_in_the_process(tmp_path, monkeypatch):
    # torch loaded its NVRTC first: the package's own search loaded nothing (nvrtc_dir() is None), and
    # kdtree-gen must still get that library's directory first, not the toolkit's from its RUNPATH.
    from kdtree import __main__ as cli
    torch_nvrtc = tmp_path / "nvidia" / "cu13" / "lib" / _loader.build_info()["NVRTC_SONAME"]
    torch_nvrtc.parent.mkdir(parents=True)
    torch_nvrtc.write_bytes(b"")
    monkeypatch.setattr(_loader, "_load_nvrtc", lambda: None)
    monkeypatch.setattr(_loader, "_nvrtc_dir", None)
    monkeypatch.setattr(_loader, "loaded_nvrtc_path", lambda: str(torch_nvrtc))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    env = cli.kdtree_gen_env()
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(torch_nvrtc.parent), "/elsewhere"]


def test_python_m_kdtree_info_kdtree_gen_uses_the_package_nvrtc(tmp_path):
    env = dict(os.environ, KDTREE_CACHE_DIR=str(tmp_path / "c"))
    r = _python_m("info", env=env)
    assert r.returncode == 0, r.stderr
    gen = [line for line in r.stdout.splitlines() if line.startswith("NVRTC:")]
    pkg = [line for line in r.stdout.splitlines() if line.startswith("nvrtc: ")]
    assert gen and pkg, r.stdout
    gen_path = gen[0].rsplit("(", 1)[1].rstrip(")")
    pkg_path = pkg[0].split()[-1]
    assert os.path.dirname(gen_path) == os.path.dirname(os.path.realpath(pkg_path)), r.stdout
    assert gen[0].split()[1] == pkg[0].split()[1], r.stdout  # the same version
    assert "kdtree-gen uses NVRTC" not in r.stdout


def test_python_m_kdtree_info_prints_both_nvrtc_versions_when_they_differ(monkeypatch, capsys):
    from kdtree import __main__ as cli
    monkeypatch.setattr(_loader, "loaded_nvrtc_path", lambda: "/site/nvidia/cu13/lib/libnvrtc.so.13")
    monkeypatch.setattr(_loader, "nvrtc_version", lambda path=None: "13.2")
    cli._python_info(cli._kdtree_gen_nvrtc("kdtree:  0.1.0\nNVRTC:   13.0 (/usr/local/cuda/lib64/libnvrtc.so.13)\n"))
    out = capsys.readouterr().out
    assert "nvrtc: 13.2 /site/nvidia/cu13/lib/libnvrtc.so.13" in out
    assert "kdtree-gen uses NVRTC 13.0, the package NVRTC 13.2" in out
