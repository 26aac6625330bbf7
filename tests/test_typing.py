"""Typed and discoverable API: what type checkers and editors see.

One ``mypy --strict`` run (the settings of pyproject.toml's ``[tool.mypy]``) over the built
package (with its generated stub ``pyggml/_ggml.pyi``), ``examples/`` (the scripts and their
packages, e.g. ``examples/llama_ggml/``), every Python block of
the README and of the documentation's pages (each a file, as a user would write it) and a file
of deliberate mistakes: all but the last must be clean, and every mistake must be reported
where it is (so the stub and the generated op methods really type-check, instead of being
``Any``). Skipped only when mypy is not installed (``pip install .[test]`` installs it).
"""
from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, docs_python_blocks

import pyggml
from pyggml.core import ops
from pyggml.core._unchecked_ops import UNCHECKED_OPS, UncheckedOps

README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
#: the Python blocks of the documentation's pages (docs/), those not run by tests/test_docs.py too
DOCS_BLOCKS = docs_python_blocks(runnable_only=False)

#: mistakes mypy must find: each line with ``# E: <error code>`` must be reported with that code
MISTAKES = '''\
import numpy as np

import pyggml
from pyggml import GGMLType, lib

ctx = pyggml.Context(1 << 20)
a = ctx.from_numpy(np.ones(4, np.float32))
t = GGMLType.F33                                   # E: attr-defined
ctx.conv_transpose_1d(a, a, "1", 0, 1)             # E: arg-type
ctx.conv_transpose_1d(a, a, s0=1, p0=0)            # E: call-arg
ctx.no_such_op(a)                                  # E: attr-defined
lib.ggml_add(ctx.ptr, a.ptr)                       # E: call-arg
lib.ggml_nbytes(a)                                 # E: arg-type
lib.ggml_set_name(a.ptr, "str, not bytes")         # E: arg-type
n: str = lib.ggml_nelements(a.ptr)                 # E: assignment
m: str = lib.GGML_TYPE_F32                         # E: assignment
lib.ggml_no_such_function()                        # E: attr-defined
with pyggml.Context() as c2:
    s: str = c2.add(a, a)                          # E: assignment
'''


def _copy_package(dst: Path) -> None:
    """The built package's Python files (and stubs), without its libraries and headers."""
    src = pyggml.PACKAGE_DIR
    if not (src / "_ggml.pyi").is_file():
        pytest.fail(f"{src} has no _ggml.pyi: built before the stub was generated; run "
                    "`python build_ggml.py --generate-only` (or rebuild)")
    shutil.copytree(src, dst / "pyggml", ignore=shutil.ignore_patterns(
        "lib", "include", "*.so", "__pycache__", "*.json"))


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[str]], str]:
    """({file name: its error lines}, the whole output) of one mypy run."""
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra)")
    tmp = tmp_path_factory.mktemp("typing")
    _copy_package(tmp / "pkg")
    src = tmp / "src"
    src.mkdir()
    for f in sorted((ROOT / "examples").glob("*.py")):
        shutil.copy2(f, src / f.name)
    for pkg in sorted((ROOT / "examples").glob("*/__init__.py")):   # an example's own package
        shutil.copytree(pkg.parent, src / pkg.parent.name, ignore=shutil.ignore_patterns("__pycache__"))
    for i, block in enumerate(README_BLOCKS):
        (src / f"readme_block_{i}.py").write_text(block)
    for i, (_, block) in enumerate(DOCS_BLOCKS):
        (src / f"docs_block_{i}.py").write_text(block)
    (src / "mistakes.py").write_text(MISTAKES)
    env = dict(os.environ, MYPYPATH=str(tmp / "pkg"))
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--strict",
         "--no-error-summary", "--show-error-codes", "--cache-dir", str(tmp / "cache"),
         str(tmp / "pkg" / "pyggml"), *sorted(p.name for p in src.glob("*.py")),
         *sorted(p.parent.name for p in src.glob("*/__init__.py"))],
        cwd=src, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode not in (0, 1) or "error:" in r.stderr:
        pytest.fail(f"mypy did not run: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    errors: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(.+?):\d+: error: ", line)
        if m:
            errors.setdefault(Path(m.group(1)).name, []).append(line)
    return errors, r.stdout


def test_package_examples_readme_and_docs_pass_mypy_strict(mypy_run):
    errors, out = mypy_run
    where = {f"docs_block_{i}.py": page for i, (page, _) in enumerate(DOCS_BLOCKS)}
    wrong = [f"{line}  (docs/{where[name]})" if name in where else line
             for name, lines in errors.items() if name != "mistakes.py" for line in lines]
    assert not wrong, "mypy --strict found errors:\n" + "\n".join(wrong)
    assert len(README_BLOCKS) >= 1 and len(DOCS_BLOCKS) >= 5


def test_mypy_finds_each_deliberate_mistake(mypy_run):
    errors, out = mypy_run
    expected = {(i, m.group(1)) for i, line in enumerate(MISTAKES.splitlines(), 1)
                if (m := re.search(r"# E: ([a-z-]+)", line))}
    found = set()
    for line in errors.get("mistakes.py", []):
        m = re.match(r".+?:(\d+): error: .*\[([a-z-]+)\]$", line)
        assert m, line
        found.add((int(m.group(1)), m.group(2)))
    assert found == expected, out


def test_unchecked_ops_are_real_methods_with_c_parameters():
    ctx = pyggml.Context(1 << 20)
    try:
        # every op constructor of the headers is a method: checked in Ops, or generated
        hand_written = {n for n in vars(ops.Ops) if not n.startswith("_")}
        assert ops.op_constructors() <= hand_written | UNCHECKED_OPS
        assert not UNCHECKED_OPS & hand_written
        assert UNCHECKED_OPS <= set(dir(ctx))
        m = ctx.conv_transpose_1d
        assert "conv_transpose_1d" in dir(ctx) and "conv_transpose_1d" in vars(UncheckedOps)
        assert list(inspect.signature(m).parameters) == ["a", "b", "s0", "p0", "d0"]
        doc = inspect.getdoc(m) or ""
        assert "ggml_conv_transpose_1d" in doc and "// stride" in doc and "forked" in doc
        # called with keywords too, and still tried in a fork first
        a = ctx.from_numpy(np.ones((2, 3), np.float32))
        assert ctx.cont_2d(a, ne0=3, ne1=2).ne == (3, 2, 1, 1)
        with pytest.raises(ValueError, match="would abort"):
            ctx.cont_2d(a, ne0=5, ne1=5)
    finally:
        ctx.close()


def test_lib_stub_names_every_function_and_constant():
    text = (pyggml.PACKAGE_DIR / "_ggml.pyi").read_text()
    stubbed = set(re.findall(r"^    def (\w+)\(self", text, flags=re.M))
    stubbed |= set(re.findall(r"^    (\w+): ", text, flags=re.M))
    missing = {n for n in dir(pyggml.lib) if not n.startswith("_")} - stubbed
    assert not missing, sorted(missing)[:20]
    assert "    def ggml_add(self, ctx: CData, a: CData, b: CData, /) -> CData:" in text
    assert "    GGML_TYPE_F32: int" in text
