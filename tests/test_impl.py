"""ggml backends written in Python (pyggml.impl): registration, scheduling beside the CPU,
own buffer types, failures, threads, interpreter exit."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import pyggml
from pyggml import Context, CPUBackend, GGMLType, Scheduler
from pyggml.cpu import cpu_buffer_type
from pyggml.device import device_by_name
from pyggml.impl import HostBuffer, PyBackend, PyBufferType, PyDevice, PyRegistry, register, unregister
from pyggml.ops import host_array

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


def test_registered_device_appears_in_ggml_enumeration(arith):
    assert "ARITH" in [d.name for d in pyggml.devices()]
    dev = device_by_name("arith")
    assert dev.type == "accel" and dev.description.startswith("element-wise")
    assert dev.registry.name == "ARITH"
    with dev.init() as be:
        assert be.name == "ARITH" and len(be.guid) == 16


def test_scheduler_splits_between_python_backend_and_cpu(arith):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = x + 1
    be, cpu = device_by_name("ARITH").init(), CPUBackend()
    sched = Scheduler([be, cpu])
    with Context.for_tensors(16, graph_size=32) as ctx:
        a, b, out, g = _graph(ctx)
        sched.alloc_graph(g)
        a.set(x)
        b.set(y)
        sched.compute(g)
        np.testing.assert_array_equal(out.numpy(), _expected(x, y))
        assert sched.n_splits == 3     # ARITH (ADD, MUL) | CPU (SQR) | ARITH (ADD)
        assert arith.seen == ["ADD", "MUL", "ADD"]
        assert sched.get_tensor_backend(out) is be
    sched.close()
    be.close()
    cpu.close()


def test_exception_in_graph_compute_is_reraised_not_success(arith):
    arith.fail = True
    be, cpu = device_by_name("ARITH").init(), CPUBackend()
    sched = Scheduler([be, cpu])
    with Context.for_tensors(16, graph_size=32) as ctx:
        a, b, out, g = _graph(ctx)
        sched.alloc_graph(g)
        with pytest.raises(RuntimeError, match="backend failure"):
            sched.compute(g)
    sched.close()
    be.close()
    cpu.close()


def test_own_buffer_type_and_compute_from_another_thread():
    dev = ArithDevice("ARITH_OWN", own_buffers=True)
    reg = PyRegistry("ARITH_OWN", [dev])
    register(reg)
    try:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        be = device_by_name("ARITH_OWN").init()
        buft = be.default_buffer_type
        assert buft.name == "ARITH_HOST" and buft.is_host and buft.device.name == "ARITH_OWN"
        with Context.for_tensors(16, graph_size=32) as ctx:
            a = ctx.new_tensor(GGMLType.F32, [4, 2])
            b = ctx.new_tensor(GGMLType.F32, [4, 2])
            out = (a + b) * a
            buf = ctx.alloc_tensors(be)        # one HostBuffer, data in NumPy memory
            assert buf.name == "ARITH_HOST" and HostBufferType.allocated
            a.set(x)
            b.set(x)
            np.testing.assert_array_equal(a.numpy(), x)   # get_tensor of the Python buffer
            g = ctx.new_graph(32).build_forward(out)
            pyggml.GraphAllocator(be).alloc_graph(g)
            errors = []

            def work():
                try:
                    g.compute(be)
                except BaseException as e:  # pragma: no cover - reported below
                    errors.append(e)

            t = threading.Thread(target=work)
            t.start()
            t.join()
            assert not errors
            np.testing.assert_array_equal(out.numpy(), (x + x) * x)
        be.close()
    finally:
        unregister(reg)


def test_registration_is_undone_at_interpreter_exit(tmp_path):
    code = textwrap.dedent('''
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_impl import ArithDevice
        from pyggml.impl import PyRegistry, register
        from pyggml.device import device_by_name
        register(PyRegistry("EXITTEST", [ArithDevice("EXITTEST")]))
        be = device_by_name("EXITTEST").init()   # left open on purpose
        print("registered")
    ''')
    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    r = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], env=env,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "registered", r.stderr


# --------------------------------------------------------------------------------------------
# loadable modules, run by upstream's own test-backend-ops

ARITH_SCRIPT = '''
import numpy as np
from pyggml import GGMLType
from pyggml.cpu import cpu_buffer_type
from pyggml.impl import PyBackend, PyDevice, PyRegistry
from pyggml.ops import host_array


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


def test_module_built_from_a_script_runs_under_test_backend_ops(tmp_path, test_backend_ops):
    from pyggml.module import build_module

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


# --------------------------------------------------------------------------------------------
# the NumPy reference backend

CI_OPS = "ADD,MUL,SCALE,NORM,RMS_NORM,SOFT_MAX,GET_ROWS,SET_ROWS,CONT,CPY,SWIGLU,GELU,SILU,ROPE,MUL_MAT"


def test_numpy_backend_passes_test_backend_ops_for_the_ops_models_use(tmp_path, test_backend_ops):
    """Upstream's oracle, bounded to the ops MiniLM and LLaMA-style graphs use (the whole suite:
    scripts/numpy_backend_conformance.py). Every case the backend claims must pass."""
    from pyggml.module import build_module

    module = build_module("pyggml.numpy_backend:make_registry", tmp_path / "libggml-numpy.so")
    env = dict(os.environ, GGML_BACKEND_PATH=str(module))
    r = subprocess.run([str(test_backend_ops), "test", "-b", "NUMPY", "-o", CI_OPS, "-p", "type=f32|type_a=f32|type=f16"],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", r.stdout)
    assert passed and passed.group(1) == passed.group(2) and int(passed.group(1)) > 300
    print(f"test-backend-ops on NUMPY ({CI_OPS}): {passed.group(0)}")


def test_numpy_backend_support_mode_lists_its_claims(tmp_path, test_backend_ops):
    from pyggml.module import build_module

    module = build_module("pyggml.numpy_backend:make_registry", tmp_path / "libggml-numpy.so")
    env = dict(os.environ, GGML_BACKEND_PATH=str(module))
    r = subprocess.run([str(test_backend_ops), "support", "-b", "NUMPY", "-o", "ADD,FLASH_ATTN_EXT"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert re.search(r"ADD\(.*\): SUPPORTED", out)
    assert "FLASH_ATTN_EXT(" in out and not re.search(r"FLASH_ATTN_EXT\(.*\): SUPPORTED", out)


def test_trace_backend_example_runs():
    from conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(pyggml.PACKAGE_DIR.parent))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "trace_backend.py")], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "computed: {'MUL_MAT': 1" in out and "split(s)" in out


def test_python_events():
    class Ev:
        def __init__(self):
            self.log = []

    class EvBackend(ArithBackend):
        def event_record(self, event):
            event.log.append("record")

        def event_wait(self, event):
            event.log.append("wait")

    class EvDevice(ArithDevice):
        def init_backend(self, params):
            return EvBackend(self)

        def event_new(self):
            self.events = getattr(self, "events", []) + [Ev()]
            return self.events[-1]

        def event_synchronize(self, event):
            event.log.append("sync")

        def event_free(self, event):
            event.log.append("free")

    dev = EvDevice("EVENTS")
    reg = PyRegistry("EVENTS", [dev])
    register(reg)
    try:
        d = device_by_name("EVENTS")
        assert d.props.events
        with d.init() as be:
            ev = pyggml.Event(d)
            ev.record(be)
            ev.wait(be)
            ev.synchronize()
            ev.close()
        assert dev.events[0].log == ["record", "wait", "sync", "free"]
    finally:
        unregister(reg)


def test_load_and_unload_a_python_backend_module_in_process(tmp_path):
    """ggml_backend_load / ggml_backend_unload, inside this (pytest) process: pytest has looked
    up attributes of capsule objects, which used to make cffi's embedding start-up hang."""
    from pyggml.device import load_backend, registries, unload_backend
    from pyggml.module import build_module

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
    """The same from a plain Python program."""
    script = tmp_path / "add_backend.py"
    script.write_text(ARITH_SCRIPT)
    code = textwrap.dedent(f"""
        from pyggml.device import load_backend, registries, unload_backend
        from pyggml.module import build_module
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
