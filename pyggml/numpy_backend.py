"""The NumPy reference backend: a complete ggml backend, written in Python, computed by NumPy.

Its device ``NUMPY`` (type ``accel``) computes the ops of :mod:`pyggml.numpy_ops` and claims an
(op, types, params) combination only when it computes it correctly (``numpy_ops.supports``).
It works on host memory: its buffer type is ggml's CPU buffer type, and it accepts any host
buffer, so beside the CPU backend in a :class:`~pyggml.sched.Scheduler` no tensor is copied.

    from pyggml import numpy_backend
    numpy_backend.register()                        # once per process
    sched = Scheduler([numpy_backend.init(), CPUBackend()])

As a loadable ggml module (for upstream's test-backend-ops or any ggml program)::

    python -m pyggml.module build pyggml.numpy_backend:make_registry -o libggml-numpy.so
"""
from __future__ import annotations

from functools import lru_cache
from . import impl, numpy_ops
from ._loader import ffi, lib
from .backend import Backend, BufferType
from .cpu import cpu_buffer_type
from .graph import Graph
from .tensor import Tensor

__all__ = ["NAME", "NumpyBackend", "NumpyDevice", "make_registry", "register", "init"]

NAME = "NUMPY"


class NumpyBackend(impl.PyBackend):
    """Computes each node with :func:`pyggml.numpy_ops.compute`, in graph order."""

    def graph_compute(self, graph: Graph) -> None:
        for node in graph.nodes:
            if node.is_empty_op() or not node.flags & lib.GGML_TENSOR_FLAG_COMPUTE:
                continue
            numpy_ops.compute(node)


def _support_key(op: Tensor) -> tuple:
    p = op.ptr
    srcs = tuple((s.type, tuple(s.ne), tuple(s.nb), s.view_src != ffi.NULL)
                 for s in p.src if s != ffi.NULL)
    return (p.op, p.type, tuple(p.ne), tuple(p.nb), bytes(ffi.buffer(p.op_params)), srcs)


class NumpyDevice(impl.PyDevice):
    """The ``NUMPY`` device. ``supports_op`` answers are cached per (op, types, shapes, params)."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple, bool] = {}

    def get_name(self) -> str:
        return NAME

    def get_description(self) -> str:
        return "NumPy reference backend (pyggml)"

    def init_backend(self, params: str | None) -> NumpyBackend:
        return NumpyBackend(self)

    def get_buffer_type(self) -> BufferType:
        return cpu_buffer_type()

    def supports_op(self, op: Tensor) -> bool:
        if op.is_empty_op():
            return True
        key = _support_key(op)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = bool(numpy_ops.supports(op))
        return hit

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host


def make_registry() -> impl.PyRegistry:
    """A new (unregistered) registry holding one :class:`NumpyDevice`."""
    return impl.PyRegistry(NAME, [NumpyDevice()])


@lru_cache(maxsize=None)
def register() -> impl.PyRegistry:
    """Register the NumPy backend in this process (idempotent) and return its registry."""
    reg = make_registry()
    impl.register(reg)
    return reg


def init() -> Backend:
    """A new NumPy backend (registering it first if needed)."""
    from .device import device_by_name

    register()
    return device_by_name(NAME).init()
