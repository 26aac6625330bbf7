"""The documentation (docs/, Sphinx): it builds with warnings as errors, its Python examples run
as written, and every module of the package has its place in it."""
from __future__ import annotations

import os
import pkgutil
import re
import subprocess
import sys

import pytest
from conftest import ROOT, docs_python_blocks

import pyggml

DOCS = ROOT / "docs"
if not DOCS.is_dir():  # tests run against an installed wheel from a copy of tests/ (scripts/build_wheels.sh)
    pytest.skip("no docs/ beside tests/: the documentation is tested in a source checkout",
                allow_module_level=True)
PAGES = sorted(DOCS.rglob("*.rst"))
BLOCKS = docs_python_blocks()


def test_docs_build_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx", reason='pip install ".[docs]"')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(pyggml.PACKAGE_DIR.parent), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                        "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    html = {p.relative_to(tmp_path / "html").as_posix() for p in (tmp_path / "html").rglob("*.html")}
    assert {"index.html", "install.html", "raw.html", "python_backends.html", "examples.html",
            "concepts/tensor.html", "concepts/sched.html"} <= html


def test_docs_have_python_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("where,code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_docs_python_block_runs(where, code, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{where}:\n{code}\n{r.stderr[-2000:]}"


def test_every_module_has_its_place_in_the_docs():
    text = "\n".join(p.read_text() for p in PAGES)
    generated = {"pyggml._enums", "pyggml.raw._callback_table", "pyggml.__main__"}
    modules = {m.name for m in pkgutil.walk_packages(pyggml.__path__, "pyggml.")} - generated
    modules = {m for m in modules if not m.startswith("pyggml._ggml")}
    missing = sorted(m for m in modules if not re.search(rf"(?<![\w.]){re.escape(m)}(?![\w.])", text))
    assert not missing, f"modules named on no page of docs/: {missing}"
