"""Every Python block of the README runs as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

import pyggml

BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", BLOCKS[index]], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README block {index}:\n{BLOCKS[index]}\n{r.stderr[-2000:]}"
