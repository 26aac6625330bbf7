"""The package's layout: no import cycles among pyggml's modules, no imports hidden in
functions (scripts/check_imports.py reads every import, those inside functions too)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT


def test_no_import_cycles_and_no_imports_inside_functions():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_imports.py")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 cycle(s)" in r.stdout


def test_the_checker_sees_a_cycle_and_a_local_import(tmp_path):
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import t\n"
                   "from . import x\ndef f():\n    from .y import z\n")
    assert mod.imports("p.m", src, {"p.x", "p.y", "p.t"}) == [("typing", False), ("p.t", False), ("p.x", False),
                                                             ("p.y", True)]  # type-only imports count


def test_the_layers_go_one_way():
    """The layers are folders (memory, core, backends) above the raw layer and the base modules;
    the checker places every module and would report an import of a higher layer."""
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    order = [mod.layer_of(m) for m in ("pyggml.errors", "pyggml.raw.boundary", "pyggml.types",
                                       "pyggml.memory.buffer", "pyggml.core.tensor",
                                       "pyggml.backends.sched", "pyggml.opt.loop")]
    assert order == sorted(order) and len(set(order)) == len(order)
    for name in mod.modules():
        if name.startswith("pyggml."):
            assert mod.layer_of(name) is not None, name


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages a wheel installs: a folder missing from the list is
    missing from every non-editable install (pyggml.impl.torch once was)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "pyggml").rglob("__init__.py")}
    assert folders == listed, f"not listed: {sorted(folders - listed)}; not folders: {sorted(listed - folders)}"
