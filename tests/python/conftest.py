"""pytest setup for the kdtree Python package.

The tests import the installed package (`pip install .`); a source checkout works too with
PYTHONPATH=python and KDTREE_LIBRARY=build/libkdtree.so. GPU tests are marked `gpu` and skip, saying why,
when torch sees no CUDA device.
"""

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU visible to torch")


def gpu_skip_reason():
    if not torch.cuda.is_available():
        return f"no CUDA GPU visible to torch {torch.__version__} (GPU tests skipped, not passed)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    if reason is None:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


# Worst error per operator over the session, printed at the end and written as JSON to
# $KDTREE_PY_REPORT when set (scripts/device_python.sh uses it for the closing note).
_worst = {}


@pytest.fixture
def record_error():
    def record(op, case, value):
        if op not in _worst or value > _worst[op][1]:
            _worst[op] = (case, float(value))
    return record


def pytest_terminal_summary(terminalreporter):
    if not _worst:
        return
    terminalreporter.section("kdtree: worst error per operator")
    for op, (case, value) in sorted(_worst.items()):
        terminalreporter.write_line(f"{op}: {value:.3e} ({case})")
    import json
    import os
    path = os.environ.get("KDTREE_PY_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({op: {"case": case, "worst": value} for op, (case, value) in _worst.items()}, f, indent=1)
