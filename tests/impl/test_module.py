"""pyggml.impl.module: Python backends as ggml backend modules, loaded by upstream's test-backend-ops and by Python."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from arith import ARITH_SCRIPT, CI_OPS
from conftest import compiler

import pyggml


def test_module_built_from_a_script_runs_under_test_backend_ops(tmp_path, test_backend_ops):
    from pyggml.impl.module import build_module

    script = tmp_path / "add_backend.py"
    script.write_text(ARITH_SCRIPT)
    lib_path = build_module(script, tmp_path / "libggml-pyadd.so")
    env = dict(os.environ, GGML_BACKEND_PATH=str(lib_path))
    r = subprocess.run([str(test_backend_ops), "test", "-b", "PYADD", "-o", "ADD"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", r.stdout)
    assert passed and passed.group(1) == passed.group(2) and int(passed.group(1)) > 10
    assert "Backend PYADD: \x1b[1;32mOK" in r.stdout or "Backend PYADD: OK" in r.stdout


def test_numpy_backend_passes_test_backend_ops_for_the_ops_models_use(tmp_path, test_backend_ops):
    """Upstream's oracle, bounded to the ops MiniLM and LLaMA-style graphs use (the whole suite:
    scripts/numpy_backend_conformance.py). Every case the backend claims must pass."""
    from pyggml.impl.module import build_module

    module = build_module("pyggml.impl.numpy:make_registry", tmp_path / "libggml-numpy.so")
    env = dict(os.environ, GGML_BACKEND_PATH=str(module))
    r = subprocess.run([str(test_backend_ops), "test", "-b", "NUMPY", "-o", CI_OPS, "-p", "type=f32|type_a=f32|type=f16"],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", r.stdout)
    assert passed and passed.group(1) == passed.group(2) and int(passed.group(1)) > 300
    print(f"test-backend-ops on NUMPY ({CI_OPS}): {passed.group(0)}")


def test_numpy_backend_support_mode_lists_its_claims(tmp_path, test_backend_ops):
    from pyggml.impl.module import build_module

    module = build_module("pyggml.impl.numpy:make_registry", tmp_path / "libggml-numpy.so")
    env = dict(os.environ, GGML_BACKEND_PATH=str(module))
    r = subprocess.run([str(test_backend_ops), "support", "-b", "NUMPY", "-o", "ADD,FLASH_ATTN_EXT"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert re.search(r"ADD\(.*\): SUPPORTED", out)
    assert "FLASH_ATTN_EXT(" in out and not re.search(r"FLASH_ATTN_EXT\(.*\): SUPPORTED", out)


def test_load_and_unload_a_python_backend_module_in_process(tmp_path):
    compiler("gcc")  # build_module compiles a C shim
    """ggml_backend_load / ggml_backend_unload, inside this (pytest) process: pytest has looked
    up attributes of capsule objects, which used to make cffi's embedding start-up hang."""
    from pyggml.impl.module import build_module
    from pyggml.backends.registry import load_backend, registries, unload_backend

    script = tmp_path / "add_backend.py"
    script.write_text(ARITH_SCRIPT)
    getattr(pyggml.ffi, "anything", None)
    import datetime
    getattr(datetime.datetime_CAPI, "anything", None)   # gives PyCapsule_Type a version tag
    reg = load_backend(build_module(script, tmp_path / "libggml-pyadd-inproc.so"))
    try:
        assert reg.name == "PYADD" and [d.name for d in reg.devices] == ["PYADD"]
        with reg.devices[0].init() as be:
            assert be.name == "PYADD"
    finally:
        unload_backend(reg)
    assert "PYADD" not in [r.name for r in registries()]
    # the module's Python objects outlive the unload: walking sys.modules (as inspect and
    # pytest's traceback formatting do) crashed when ggml's dlclose unmapped the library
    import inspect
    import types

    assert sum(isinstance(m, types.ModuleType) for m in list(sys.modules.values())) > 10
    assert inspect.getmodule(print) is not None


def test_load_and_unload_a_python_backend_module_from_python(tmp_path):
    compiler("gcc")  # build_module compiles a C shim
    """The same from a plain Python program."""
    script = tmp_path / "add_backend.py"
    script.write_text(ARITH_SCRIPT)
    code = textwrap.dedent(f"""
        from pyggml.backends.registry import load_backend, registries, unload_backend
        from pyggml.impl.module import build_module
        reg = load_backend(build_module({str(script)!r}, {str(tmp_path / "libggml-pyadd2.so")!r}))
        assert reg.name == "PYADD" and [d.name for d in reg.devices] == ["PYADD"]
        with reg.devices[0].init() as be:
            assert be.name == "PYADD"
        unload_backend(reg)
        assert "PYADD" not in [r.name for r in registries()]
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
