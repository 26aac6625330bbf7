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

On a CUDA device (``TorchCudaDevice``, ``TorchCudaBackend``) each backend queues its work on a
stream of its own (:mod:`pyggml.impl.torch.stream`), with asynchronous copies and device events
(``torch.cuda.Event``) for ggml's scheduler, checks row indices on the device
(:mod:`pyggml.impl.torch.checks`) and replays an unchanged plan as a CUDA graph after two
computes (:mod:`pyggml.impl.torch.capture`; ``PYGGML_TORCH_CUDA_GRAPHS=0`` disables that).

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
from typing import Any

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
from .._vtable import LIVE, addr

# the kernel table, filled by the op families as they are imported
from . import ops_attn, ops_copy, ops_elementwise, ops_matrix, ops_norm, ops_reduce, ops_train  # noqa: F401
from .capture import CAPTURED, FAILED, GRAPH, Capturer, cuda_capturer
from .capture import enabled as graphs_enabled
from .checks import DeviceChecks
from .memory import TorchBuffer, TorchBufferType, Views, generation, torch_buffer
from .plan import Plan
from .stream import BackendStream
from .table import OPS, supported_op_names, supports

__all__ = ["NAME", "TorchBackend", "TorchCudaBackend", "TorchDevice", "TorchCudaDevice", "TorchBufferType",
           "torch_devices", "make_registry", "register", "init", "supports", "supported_op_names", "OPS"]

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
            devices = [torch.device(s.strip()) for s in spec.split(",") if s.strip()]
        except RuntimeError as e:
            raise RuntimeError(f"PYGGML_TORCH_DEVICE={spec!r}: {e}") from None
        # "cuda" is the current CUDA device: named by its index, it compares equal to itself
        return [torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d
                for d in devices]
    if torch.cuda.is_available():
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


class TorchBackend(PyBackend):
    """Computes a graph by replaying its ``plan.Plan`` (built on the first compute).
    ``n_builds`` / ``n_replays`` count the computes that built a plan / reused one;
    ``n_graph_replays`` those of the reused that replayed a CUDA graph, ``n_captures`` /
    ``n_capture_failures`` the plans captured / whose capture raised.

    ``capture``: the ``capture.Capturer`` given to new plans (None: none is captured; set to
    None by a failed capture, for every plan of the backend);
    ``checks``: the ``checks.DeviceChecks`` of its steps' row checks, raised by
    :meth:`synchronize` (None: checked on the host, raised by the compute). Both are None on
    ``cpu``, where computing is synchronous and has no streams or events; ``TorchCudaBackend``
    sets them (set them on a ``cpu`` backend to run that policy where no GPU is)."""

    capture: Capturer | None = None
    checks: DeviceChecks | None = None

    def __init__(self, device: "TorchDevice"):
        super().__init__(device)
        self.torch_device = device.torch_device
        self.plans: OrderedDict[int, Plan] = OrderedDict()
        self.n_builds = 0
        self.n_replays = 0
        self.n_graph_replays = 0
        self.n_captures = 0
        self.n_capture_failures = 0
        self._generation = generation()

    def graph_compute(self, graph: Graph) -> None:
        g = graph.ptr
        n = int(lib.ggml_graph_n_nodes(g))
        if n == 0:
            return
        nodes = ffi.unpack(lib.ggml_graph_nodes(g), n)
        uid = int(lib.pyggml_graph_uid(g))
        if self._generation != generation():     # a buffer was freed: views may hold it
            self._drop_plans(freed_only=True)
            self._generation = generation()
        key = addr(nodes[0])
        plan = self.plans.get(key)
        if plan is not None and plan.matches(uid, nodes):
            self.n_replays += 1
            self._count(plan.compute())
            return
        plan = Plan(nodes, uid, Views(self.torch_device, self.checks), self.capture)
        self.n_builds += 1
        self.plans[key] = plan
        self.plans.move_to_end(key)
        while len(self.plans) > MAX_PLANS:
            if next(iter(self.plans.values())).graph.replay is not None:
                self._quiesce()     # its captured graph is not destroyed while it runs
            self.plans.popitem(last=False)
        try:
            self._count(plan.compute())
        except BaseException:
            self.plans.pop(key, None)
            raise

    def _count(self, outcome: str) -> None:
        if outcome == GRAPH:
            self.n_graph_replays += 1
        elif outcome == CAPTURED:
            self.n_captures += 1
        elif outcome == FAILED:     # torch's capture failed: never entered again by this backend
            self.n_capture_failures += 1
            self.capture = None
            for p in self.plans.values():
                p.graph.capture = None

    def _quiesce(self) -> None:
        """Wait for the work queued by this backend (none on ``cpu``)."""

    def _drop_plans(self, freed_only: bool = False) -> None:
        """Drop every plan, or (``freed_only``) those whose views see a freed buffer."""
        drop = [k for k, p in self.plans.items()
                if not freed_only or any(b.freed for b in p.views.buffers.values())]
        if any(self.plans[k].graph.replay is not None for k in drop):
            self._quiesce()         # no captured graph is destroyed while it runs
        for k in drop:
            del self.plans[k]

    def synchronize(self) -> None:
        """Raise ValueError for the row indices out of range that the steps found on the
        device since the last call (with ``checks``; computing on ``cpu`` is synchronous)."""
        if self.checks is not None:
            self.checks.raise_pending()

    def free(self) -> None:
        self._drop_plans()


class TorchCudaBackend(TorchBackend):
    """A torch backend on a CUDA device: all its work is queued on its own stream
    (``stream``, a ``stream.BackendStream``): plans (captured into CUDA graphs after two
    computes unless ``$PYGGML_TORCH_CUDA_GRAPHS`` is ``0``), ggml's asynchronous copies and
    device events. Row indices are checked on the device (``checks``): :meth:`synchronize`
    raises ValueError for those out of range. The ``*_async`` methods raise ValueError for a
    tensor that is not in a ``TorchBuffer`` on its device."""

    def __init__(self, device: "TorchDevice"):
        super().__init__(device)
        self.stream = BackendStream(self.torch_device)
        with self.stream.context():
            self.checks = DeviceChecks(self.torch_device)
        self.capture = cuda_capturer(self.stream.stream) if graphs_enabled() else None

    def graph_compute(self, graph: Graph) -> None:
        with self.stream.context():
            super().graph_compute(graph)

    def _quiesce(self) -> None:
        self.stream.synchronize()

    def synchronize(self) -> None:
        """Wait for the stream, then raise the errors its steps flagged (see ``TorchBackend``)."""
        self.stream.synchronize()
        with self.stream.context():
            super().synchronize()

    def _own(self, tensor: Tensor, what: str) -> TorchBuffer:
        buf = torch_buffer(tensor.ptr)
        if buf is None or buf.device != self.torch_device:
            raise ValueError(f"{what}: tensor {tensor._label()} is not in a buffer of {self.get_name()} "
                             f"(torch device {self.torch_device})")
        return buf

    def set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        """Copy ``data`` into ``tensor`` at byte ``offset``, queued on the stream."""
        buf = self._own(tensor, "set_tensor_async")
        buf.weights_cache.clear()
        if data.nbytes:
            self.stream.set_async(buf.span(tensor, offset, data.nbytes), data)

    def get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        """Copy ``tensor``'s bytes from ``offset`` into ``out``, queued on the stream."""
        buf = self._own(tensor, "get_tensor_async")
        if out.nbytes:
            self.stream.get_async(out, buf.span(tensor, offset, out.nbytes))

    def cpy_tensor_async(self, backend_src: Any, src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` into ``dst`` (this backend's) when ``backend_src`` is a
        ``TorchCudaBackend`` and both tensors are in ``TorchBuffer`` of their backends'
        devices, ordered after both backends' queued work; else False (ggml then synchronizes
        both backends and copies synchronously)."""
        other = LIVE.get(addr(backend_src))
        if not isinstance(other, TorchCudaBackend):
            return False
        sb, db = torch_buffer(src.ptr), torch_buffer(dst.ptr)
        n = src.nbytes
        if sb is None or db is None or sb.device != other.torch_device or db.device != self.torch_device \
                or n != dst.nbytes:
            return False
        db.weights_cache.clear()
        if n:
            self.stream.copy_from(other.stream, db.span(dst, 0, n), sb.span(src, 0, n))
        return True

    def event_record(self, event: torch.cuda.Event) -> None:
        self.stream.record(event)

    def event_wait(self, event: torch.cuda.Event) -> None:
        self.stream.wait(event)

    def free(self) -> None:
        super().free()
        self.stream.close()


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


class TorchCudaDevice(TorchDevice):
    """``TORCH<index>`` on a CUDA torch device: its backends are ``TorchCudaBackend``, and it
    has events (``torch.cuda.Event``, recorded on and waited for by the backends' streams), so
    ggml reports ``caps.async`` and ``caps.events``."""

    async_copies = True

    def init_backend(self, params: str | None) -> TorchCudaBackend:
        return TorchCudaBackend(self)

    def event_new(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def event_free(self, event: torch.cuda.Event) -> None:
        """Nothing to do: torch frees the event with the object."""

    def event_synchronize(self, event: torch.cuda.Event) -> None:
        event.synchronize()


def make_registry() -> PyRegistry:
    """A new (unregistered) registry holding a ``TorchDevice`` per :func:`torch_devices`
    (a ``TorchCudaDevice`` for a CUDA one)."""
    return PyRegistry(NAME, [TorchCudaDevice(i, d) if d.type == "cuda" else TorchDevice(i, d)
                             for i, d in enumerate(torch_devices())])


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
