"""The ARITH test backend of tests/impl: a Python device whose backend computes element-wise ADD
and MUL with NumPy (optionally in buffers of its own), its registration as a fixture, a graph
that splits between it and the CPU with the expected values, and a module script of an ADD
backend for ggml's loader. Shared by test_py_backends.py and test_module.py."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from pyggml import GGMLType
from pyggml.backends.cpu import cpu_buffer_type
from pyggml.core.ops import host_array
from pyggml.impl import HostBuffer, PyBackend, PyBufferType, PyDevice, PyRegistry, register, unregister

__all__ = ["ARITH_SCRIPT", "BINARY", "CI_OPS", "ArithBackend", "ArithDevice", "HostBufferType",
           "arith", "arith_expected", "arith_graph"]

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


@contextlib.contextmanager
def registered(name, *devices):
    """A PyRegistry of ``devices`` registered with ggml while the block runs."""
    reg = PyRegistry(name, list(devices))
    register(reg)
    try:
        yield reg
    finally:
        unregister(reg)


@pytest.fixture
def arith():
    dev = ArithDevice("ARITH")
    reg = PyRegistry("ARITH", [dev])
    register(reg)
    yield dev
    unregister(reg)


def arith_graph(ctx):
    """Inputs a, b (F32 ne [4, 2]), out = sqr((a+b)*b) + (a+b)*b and its graph: ADD and MUL on
    ARITH, SQR on the CPU."""
    a = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
    b = ctx.new_tensor(GGMLType.F32, [4, 2]).set_input()
    ab = (a + b) * b
    out = ctx.sqr(ab) + ab            # SQR only on the CPU
    return a, b, out, ctx.new_graph(32).build_forward(out)


def arith_expected(x, y):
    """What :func:`arith_graph` computes, in NumPy."""
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
