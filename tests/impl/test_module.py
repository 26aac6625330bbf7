"""pyggml.impl.module: Python backends as ggml backend modules, loaded by upstream's test-backend-ops and by Python."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import compiler

import pyggml
from pyggml import GGMLType
from pyggml.backends.cpu import cpu_buffer_type
from pyggml.impl import (
    HostBuffer,
    PyBackend,
    PyBufferType,
    PyDevice,
    PyRegistry,
    register,
    unregister,
)
from pyggml.core.ops import host_array

BINARY = {"ADD": np.add, "MUL": np.multiply}


class ArithBackend(PyBackend):
    def graph_compute(self, graph):
        for node in graph.nodes:
            if node.is_empty_op():
                continue
            self.device.seen.append(node.op_name)
            if self.device.fail:
                raise RuntimeError("backend failure")
            a, b = (host_array(s) for s in node.src[:2])
            host_array(node)[...] = BINARY[node.op_name](a, b)


class HostBufferType(PyBufferType):
    def get_name(self):
        return "ARITH_HOST"

    def alloc_buffer(self, size):
        self.allocated.append(size)
        return HostBuffer(size)

    def is_host(self):
        return True

    allocated: list = []


class ArithDevice(PyDevice):
    def __init__(self, name, own_buffers=False):
        super().__init__()
        self.name, self.seen, self.fail = name, [], False
        self.buft = HostBufferType() if own_buffers else None

    def get_name(self):
        return self.name

    def get_description(self):
        return "element-wise ADD and MUL with NumPy"

    def init_backend(self, params):
        return ArithBackend(self)

    def get_buffer_type(self):
        return self.buft or cpu_buffer_type()

    def supports_op(self, op):
        if op.is_empty_op():
            return True
        return (op.op_name in BINARY and all(s.type == GGMLType.F32 for s in op.src[:2])
                and op.src[0].ne == op.src[1].ne)

    def offload_op(self, op):
        return True


@pytest.fixture
def arith():
    dev = ArithDevice("ARITH")
    reg = PyRegistry("ARITH", [dev])
    register(reg)
    yield dev
    unregister(reg)


def _graph(ctx):
    a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
    b = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
    ab = (a + b) * b
    out = ctx.sqr(ab) + ab            # SQR only on the CPU
    return a, b, out, ctx.new_graph(32).build_forward(out)


def _expected(x, y):
    ab = (x + y) * y
    return ab ** 2 + ab


ARITH_SCRIPT = '''
import numpy as np
from pyggml import GGMLType
from pyggml.backends.cpu import cpu_buffer_type
from pyggml.impl import PyBackend, PyDevice, PyRegistry
from pyggml.core.ops import host_array


class AddBackend(PyBackend):
    def graph_compute(self, graph):
        for node in graph.nodes:
            if not node.is_empty_op():
                host_array(node)[...] = host_array(node.src[0]) + host_array(node.src[1])


class AddDevice(PyDevice):
    def get_name(self):
        return "PYADD"

    def get_description(self):
        return "ADD of same-shape F32 tensors in NumPy"

    def init_backend(self, params):
        return AddBackend(self)

    def get_buffer_type(self):
        return cpu_buffer_type()

    def supports_op(self, op):
        if op.is_empty_op():
            return True
        return (op.op_name == "ADD" and op.type == GGMLType.F32 and op.src[0].ne == op.src[1].ne
                and all(s.type == GGMLType.F32 for s in op.src[:2]))


registry = PyRegistry("PYADD", [AddDevice()])
'''

CI_OPS = "ADD,MUL,SCALE,NORM,RMS_NORM,SOFT_MAX,GET_ROWS,SET_ROWS,CONT,CPY,SWIGLU,GELU,SILU,ROPE,MUL_MAT"


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
