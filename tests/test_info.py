"""python -m pyggml info: what the installation contains and found."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pyggml
from pyggml.backends.info import format_info, info


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


def test_nothing_of_the_building_machine_is_left_in_the_package():
    """The extension finds its libraries through ``$ORIGIN/lib`` only (no rpath into the
    building Python's prefix), and the recorded build has no absolute path of the build host
    (pip's temporary ninja, the source folder)."""
    ext = next(pyggml.PACKAGE_DIR.glob("_ggml*.so"))
    dynamic = subprocess.run(["readelf", "-d", str(ext)], check=True, capture_output=True,
                             text=True).stdout
    paths = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines()
             if "(RPATH)" in line or "(RUNPATH)" in line]
    entries = [e for p in paths for e in p.split(":")]
    assert "$ORIGIN/lib" in entries
    # auditwheel adds $ORIGIN/../pyggml.libs for the libraries it grafts (libgomp)
    assert all(e.startswith("$ORIGIN/") for e in entries), entries
    build = info()["build"]
    recorded = [build["source"], *build["cmake_args"]]
    assert [a for a in recorded if "=/" in a or a.startswith("/")] == []


def test_the_package_ships_ggmls_license_and_notices():
    """The libraries are ggml's (MIT): its LICENSE and the notices of code compiled into them
    (llamafile's sgemm, MIT, Mozilla Foundation) travel with every install and wheel."""
    licenses = pyggml.PACKAGE_DIR / "licenses"
    assert "The ggml authors" in (licenses / "ggml-LICENSE").read_text()
    notices = (licenses / "NOTICES").read_text()
    assert "sgemm.cpp" in notices and "Copyright 2024 Mozilla Foundation" in notices
    assert "Permission is hereby granted" in notices
