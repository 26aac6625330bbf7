"""The package's layout: no import cycles among pyggml's modules, no imports hidden in
functions (scripts/check_imports.py reads every import, those inside functions too)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

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
