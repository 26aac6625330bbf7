"""The ported upstream examples print what the upstream C programs print.

The C programs are compiled from the vendored upstream source against pyggml's own libraries.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compiler, ggml_link_args, ggml_tree, stage_backend_modules

import pyggml

UPSTREAM = ggml_tree() / "examples" / "simple"


def _upstream_output(name: str, tmp_path: Path) -> str:
    src = UPSTREAM / f"{name}.cpp"
    if not src.is_file():
        pytest.skip("needs vendor/ggml-<version> (filled by the build)")
    gxx = compiler("g++")
    exe = tmp_path / name
    subprocess.run([gxx, "-O1", str(src), "-I", str(pyggml.INCLUDE_DIR), *ggml_link_args(), "-o", str(exe)],
                   check=True)
    stage_backend_modules(tmp_path)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def _port_output(name: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    return subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")], check=True,
                          capture_output=True, text=True, cwd=ROOT / "examples", env=env).stdout


@pytest.mark.parametrize("name", ["simple-ctx", "simple-backend"])
def test_port_prints_what_upstream_prints(name, tmp_path):
    expected = _upstream_output(name, tmp_path)
    assert "mul mat (4 x 3)" in expected
    assert _port_output(name.replace("-", "_")) == expected
