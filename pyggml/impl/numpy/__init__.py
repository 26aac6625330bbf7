"""The NumPy reference backend: a complete ggml backend, written in Python, computed by NumPy.

Its device ``NUMPY`` (type ``accel``) computes the ops of the kernel table
(:mod:`pyggml.impl.numpy.table`: :func:`supports`, :func:`compute`, :data:`OPS`; the kernels are
in ``ops_*`` modules by op family, over :mod:`.memory` and :mod:`.math`) and claims an (op,
types, params) combination only when it computes it correctly. It works on host memory: its
buffer type is ggml's CPU buffer type, and it accepts any host buffer, so beside the CPU backend
in a :class:`~pyggml.backends.sched.Scheduler` no tensor is copied (its own buffer type,
:class:`NumpyBufferType`, is host memory owned by NumPy, which the CPU backend reads in place)::

    from pyggml.impl import numpy as numpy_backend
    numpy_backend.register()                        # once per process
    sched = Scheduler([numpy_backend.init(), CPUBackend()])

As a loadable ggml module (for upstream's test-backend-ops or any ggml program)::

    python -m pyggml.impl.module build pyggml.impl.numpy:make_registry -o libggml-numpy.so
"""
from __future__ import annotations

from functools import lru_cache

from ...backends.backend import Backend
from ...memory.buffer_type import BufferType
from ...backends.device import device_by_name
from ...enums import TensorFlag
from ...core.graph import Graph
from ...raw import ffi
from ...core.tensor import EMPTY_OPS, Tensor
from .. import HostBuffer, PyBackend, PyBufferType, PyDevice, PyRegistry
from .. import register as _register
from ..kernel_table import SupportCache

# the kernel table, filled by the op families as they are imported
from . import (  # noqa: F401
    ops_copy,
    ops_elementwise,
    ops_matrix,
    ops_misc,
    ops_norm,
    ops_reduce,
    ops_rope,
    ops_rows,
    ops_softmax,
)
from .table import OPS, OpImpl, compute, supported_op_names, supports

__all__ = ["NAME", "NumpyBackend", "NumpyBufferType", "NumpyDevice", "make_registry", "register", "init",
           "supports", "compute", "OPS", "OpImpl", "supported_op_names"]

NAME = "NUMPY"
_COMPUTE = int(TensorFlag.COMPUTE)


class NumpyBackend(PyBackend):
    """Computes each node with :func:`compute`, in graph order."""

    def graph_compute(self, graph: Graph) -> None:
        for p in graph.raw_nodes():
            if p.op in EMPTY_OPS or not p.flags & _COMPUTE:
                continue
            compute(p)


class NumpyBufferType(PyBufferType):
    """Host memory owned by NumPy (:class:`~pyggml.impl.HostBuffer`), 64-byte aligned. Its
    ``layout_n`` is the reference for that slot: a context's tensors one after another in one
    buffer, each at the next multiple of the alignment (``ggml_backend_alloc_ctx_tensors``)."""

    def get_name(self) -> str:
        return NAME

    ALIGNMENT = 64

    def get_alignment(self) -> int:
        return self.ALIGNMENT

    def is_host(self) -> bool:
        return True

    def alloc_buffer(self, size: int) -> HostBuffer:
        return HostBuffer(size)

    def layout_n(self, tensors: list[Tensor]) -> list[int | None]:
        offsets: list[int | None] = []
        end = 0
        for t in tensors:
            p = t.ptr
            if p.data != ffi.NULL or p.view_src != ffi.NULL:
                offsets.append(None)
                continue
            offsets.append(end)
            end += -(-t.nbytes // self.ALIGNMENT) * self.ALIGNMENT
        return offsets


class NumpyDevice(PyDevice):
    """The ``NUMPY`` device. ``supports_op`` answers are cached per (op, types, shapes, params)."""

    def __init__(self) -> None:
        self._supports = SupportCache(supports)
        self._own_buft = NumpyBufferType()
        super().__init__()

    def get_name(self) -> str:
        return NAME

    def get_description(self) -> str:
        return "NumPy reference backend (pyggml)"

    def init_backend(self, params: str | None) -> NumpyBackend:
        return NumpyBackend(self)

    def get_buffer_type(self) -> PyBufferType | BufferType:
        return self._own_buft

    def supports_op(self, op: Tensor) -> bool:
        return self._supports(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host


def make_registry() -> PyRegistry:
    """A new (unregistered) registry holding one :class:`NumpyDevice`."""
    return PyRegistry(NAME, [NumpyDevice()])


@lru_cache(maxsize=None)
def register() -> PyRegistry:
    """Register the NumPy backend in this process (idempotent) and return its registry."""
    reg = make_registry()
    _register(reg)
    return reg


def init() -> Backend:
    """A new NumPy backend (registering it first if needed)."""
    register()
    return device_by_name(NAME).init()
