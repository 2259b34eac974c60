"""GPU: the README's torch example runs as written."""

import os
import re

import pytest

pytestmark = pytest.mark.gpu

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_python_example_runs(capsys):
    with open(README) as f:
        text = f.read()
    section = text[text.index("## Python (PyTorch)"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "torch.Size([32, 16, 512]) torch.Size([32, 16])"
