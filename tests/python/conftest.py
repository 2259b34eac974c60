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
