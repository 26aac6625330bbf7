"""A ggml backend written in Python over torch tensors: device memory of any torch device, ops as
torch calls, a graph's calls bound once and replayed.

Devices ``TORCH0``, ``TORCH1``... are torch devices: by default ``cuda:0``, ``cuda:1``... when
``torch.cuda.is_available()``, else ``cpu``; the environment variable ``PYGGML_TORCH_DEVICE``
(a comma-separated list, e.g. ``"cpu"`` or ``"cuda:1,cpu"``) chooses them instead. Each has its
own buffer type (``TorchBufferType``: buffers are ``uint8`` torch tensors, tensors
are torch views of them, no copies) and computes the ops of its kernel table
(:mod:`pyggml.impl.torch.table`; ``supported_op_names()``), claiming an (op, types, params) combination only when
it computes it correctly. A graph's first compute binds each node to a torch call on fixed views
(``Plan``, :mod:`pyggml.impl.torch.plan`); later computes of the unchanged graph replay the calls.

On ``cpu`` the buffers are host memory (the CPU backend reads them in place) and the device
reads any host buffer, so beside ggml's CPU backend in a :class:`~pyggml.backends.sched.Scheduler`
no tensor is copied; on a GPU the scheduler copies inputs into the device's buffers::

    from pyggml.impl import torch as torch_backend
    torch_backend.register()                        # once per process
    sched = Scheduler([torch_backend.init(), CPUBackend()])

As a loadable ggml module (``test-backend-ops -b TORCH0``)::

    python -m pyggml.impl.module build pyggml.impl.torch:make_registry -o libggml-torch.so

Requires torch (``pip install "pyggml[torch]"``); importing this package without it raises
ImportError.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from functools import lru_cache

import torch

from ...backends.backend import Backend
from ...backends.device import device_by_name
from ...core.graph import Graph
from ...core.tensor import Tensor
from ...enums import DeviceType
from ...memory.buffer_type import BufferType
from ...raw import ffi, lib
from .. import PyBackend, PyDevice, PyRegistry
from .. import register as _register
from ..kernel_table import SupportCache
from .._vtable import addr

# the kernel table, filled by the op families as they are imported
from . import ops_attn, ops_copy, ops_elementwise, ops_matrix, ops_norm, ops_reduce, ops_train  # noqa: F401
from .memory import TorchBufferType, Views, generation
from .plan import Plan
from .table import OPS, supported_op_names, supports

__all__ = ["NAME", "TorchBackend", "TorchDevice", "TorchBufferType", "torch_devices", "make_registry",
           "register", "init", "supports", "supported_op_names", "OPS"]

NAME = "TORCH"

#: plans kept per backend (one per graph or scheduler split, by first node)
MAX_PLANS = 64


def torch_devices() -> list[torch.device]:
    """The torch devices of ``TORCH0``, ``TORCH1``...: ``$PYGGML_TORCH_DEVICE`` (comma-separated)
    if set, else every CUDA device if ``torch.cuda.is_available()``, else ``cpu``. Raises
    RuntimeError for a device name torch does not parse."""
    spec = os.environ.get("PYGGML_TORCH_DEVICE", "").strip()
    if spec:
        try:
            return [torch.device(s.strip()) for s in spec.split(",") if s.strip()]
        except RuntimeError as e:
            raise RuntimeError(f"PYGGML_TORCH_DEVICE={spec!r}: {e}") from None
    if torch.cuda.is_available():
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


class TorchBackend(PyBackend):
    """Computes a graph by replaying its ``plan.Plan`` (built on the first compute).
    ``n_builds`` / ``n_replays`` count the computes that built a plan / reused one."""

    def __init__(self, device: "TorchDevice"):
        super().__init__(device)
        self.torch_device = device.torch_device
        self.plans: OrderedDict[int, Plan] = OrderedDict()
        self.n_builds = 0
        self.n_replays = 0
        self._generation = generation()

    def graph_compute(self, graph: Graph) -> None:
        g = graph.ptr
        n = int(lib.ggml_graph_n_nodes(g))
        if n == 0:
            return
        nodes = ffi.unpack(lib.ggml_graph_nodes(g), n)
        uid = int(lib.pyggml_graph_uid(g))
        if self._generation != generation():     # a buffer was freed: views may hold it
            self.plans.clear()
            self._generation = generation()
        key = addr(nodes[0])
        plan = self.plans.get(key)
        if plan is not None and plan.matches(uid, nodes):
            self.n_replays += 1
            plan.run()
            return
        plan = Plan(nodes, uid, Views(self.torch_device))
        self.n_builds += 1
        self.plans[key] = plan
        self.plans.move_to_end(key)
        while len(self.plans) > MAX_PLANS:
            self.plans.popitem(last=False)
        try:
            plan.run()
        except BaseException:
            self.plans.pop(key, None)
            raise

    def synchronize(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def free(self) -> None:
        self.plans.clear()


class TorchDevice(PyDevice):
    """The device ``TORCH<index>`` on torch device ``torch_device``. ``supports_op`` answers
    are cached per (op, types, shapes, params)."""

    def __init__(self, index: int, torch_device: torch.device):
        self.index, self.torch_device = index, torch_device
        self._supports = SupportCache(supports)
        self._own_buft = TorchBufferType(f"{NAME}{index}", torch_device)
        super().__init__()

    def get_name(self) -> str:
        return f"{NAME}{self.index}"

    def get_description(self) -> str:
        return f"torch {torch.__version__} on {self.torch_device} (pyggml)"

    def get_type(self) -> DeviceType:
        return DeviceType.ACCEL if self.torch_device.type == "cpu" else DeviceType.GPU

    def get_memory(self) -> tuple[int, int]:
        if self.torch_device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.torch_device)
            return int(free), int(total)
        return 0, 0

    def init_backend(self, params: str | None) -> TorchBackend:
        return TorchBackend(self)

    def get_buffer_type(self) -> TorchBufferType:
        return self._own_buft

    def supports_op(self, op: Tensor) -> bool:
        return self._supports(op)

    def supports_buft(self, buft: BufferType) -> bool:
        """Its own buffer type; on ``cpu`` also any host buffer type."""
        if addr(buft.ptr) == addr(self._own_buft.ptr):
            return True
        return self.torch_device.type == "cpu" and buft.is_host


def make_registry() -> PyRegistry:
    """A new (unregistered) registry holding a ``TorchDevice`` per :func:`torch_devices`."""
    return PyRegistry(NAME, [TorchDevice(i, d) for i, d in enumerate(torch_devices())])


@lru_cache(maxsize=None)
def register() -> PyRegistry:
    """Register the torch backend in this process (idempotent) and return its registry."""
    reg = make_registry()
    _register(reg)
    return reg


def init(index: int = 0) -> Backend:
    """A new backend on device ``TORCH<index>`` (registering the devices first if needed)."""
    register()
    return device_by_name(f"{NAME}{index}").init()
