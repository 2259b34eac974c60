"""CPU: the ctypes structs in kdtree/_lib.py match include/kdtree/kdtree.h as a C compiler lays it out."""

import os
import shutil
import subprocess

import pytest

from kdtree import _lib, _loader


def _header_dir():
    shipped = os.path.join(_loader.NATIVE_DIR, "include")
    if os.path.exists(os.path.join(shipped, "kdtree", "kdtree.h")):
        return shipped
    source = os.path.join(os.path.dirname(__file__), "..", "..", "include")
    if os.path.exists(os.path.join(source, "kdtree", "kdtree.h")):
        return source
    pytest.skip("kdtree.h is neither shipped with the package nor in a source checkout")


@pytest.mark.parametrize("struct", sorted(_lib.STRUCTS))
def test_struct_layout_matches_the_header(struct, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to lay the header out")
    cls = _lib.STRUCTS[struct]
    fields = [name for name, _ in cls._fields_]
    src = tmp_path / "layout.c"
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <kdtree/kdtree.h>", "int main(void) {",
             f'  printf("size %zu\\n", sizeof({struct}));']
    lines += [f'  printf("{f} %zu\\n", offsetof({struct}, {f}));' for f in fields]
    lines += ["  return 0;", "}"]
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", _header_dir(), str(src), "-o", str(exe)], check=True)
    c_layout = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                             check=True).stdout.splitlines())
    assert int(c_layout["size"]) == _ctypes_size(cls)
    for f in fields:
        assert int(c_layout[f]) == getattr(cls, f).offset, f"{struct}.{f}"


def _ctypes_size(cls):
    import ctypes
    return ctypes.sizeof(cls)
