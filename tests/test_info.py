"""python -m pyggml info: what the installation contains and found."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pyggml
from pyggml.info import format_info, info


def test_info_reports_version_libraries_and_devices():
    data = info()
    assert data["ggml_version"] == pyggml.GGML_VERSION
    assert "libggml.so" in data["libraries"] and "CPU" in data["registries"]
    cpu = next(d for d in data["devices"] if d["name"] == "CPU")
    assert cpu["type"] == "cpu" and cpu["memory_total"] > 0
    assert "-DBUILD_SHARED_LIBS=ON" in data["build"]["cmake_args"]
    assert "CPU" in format_info(data)


def test_info_command_prints_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    out = subprocess.run([sys.executable, "-m", "pyggml", "info", "--json"], env=env, check=True,
                         capture_output=True, text=True, cwd=tmp_path).stdout
    assert json.loads(out)["ggml_version"] == pyggml.GGML_VERSION
