"""ggml-backend objects: buffer types (buft), buffers, backends and events.

Ownership follows ggml: a :class:`BufferType` belongs to its device and is never freed; a
:class:`Buffer` from ``alloc_buffer`` is owned (``ggml_backend_buffer_free`` on close); a
:class:`Backend` from a device is owned (``ggml_backend_free``); an :class:`Event` is owned
(``ggml_backend_event_free``). Each object keeps alive the objects it was made from.

Every method checks what ggml would assert on (NULL vtable slots, tensors without data, sizes
out of range) and raises a Python exception instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import callbacks
from ._base import CObject, GGMLError
from ._loader import ffi, lib
from .tensor import Tensor

if TYPE_CHECKING:
    from .device import Device
    from .graph import Graph

__all__ = ["BufferType", "Buffer", "Backend", "Event", "BUFFER_USAGE"]

#: ``ggml_backend_buffer_usage`` by name
BUFFER_USAGE = {"any": lib.GGML_BACKEND_BUFFER_USAGE_ANY,
                "weights": lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                "compute": lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE}


def _str(p: Any) -> str:
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


def _tensor_with_data(t: Tensor) -> Any:
    p = t._check_data()
    if t.buffer_ptr == ffi.NULL:
        raise ValueError(f"tensor {t.name!r} is not in a backend buffer")
    return p


def _same_layout(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_layout (static in ggml-impl.h): same type, ne and nb."""
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def _check_range(t: Tensor, offset: int, size: int) -> None:
    if offset < 0 or size < 0 or offset + size > t.nbytes:
        raise ValueError(f"bytes [{offset}, {offset + size}) are outside tensor {t.name!r} ({t.nbytes} bytes)")


class BufferType(CObject):
    """A buffer type (``ggml_backend_buffer_type_t``): how and where a device allocates memory.
    Borrowed: it lives as long as its device/library."""

    _kind = "buffer type"

    def __init__(self, ptr: Any, owner: Any = None):
        super().__init__(ptr, owned=False, owner=owner)

    @property
    def name(self) -> str:
        """``ggml_backend_buft_name``."""
        return _str(lib.ggml_backend_buft_name(self.ptr))

    @property
    def alignment(self) -> int:
        """Byte alignment of allocations (``ggml_backend_buft_get_alignment``)."""
        return lib.ggml_backend_buft_get_alignment(self.ptr)

    @property
    def max_size(self) -> int:
        """Largest single buffer in bytes (``ggml_backend_buft_get_max_size``)."""
        return lib.ggml_backend_buft_get_max_size(self.ptr)

    @property
    def is_host(self) -> bool:
        """Whether buffers of this type are in host memory (``ggml_backend_buft_is_host``)."""
        return bool(lib.ggml_backend_buft_is_host(self.ptr))

    @property
    def device(self) -> "Device | None":
        """``ggml_backend_buft_get_device`` (None for buffer types without a device)."""
        from .device import Device

        d = lib.ggml_backend_buft_get_device(self.ptr)
        return None if d == ffi.NULL else Device(d)

    def alloc_size(self, tensor: Tensor) -> int:
        """Bytes a tensor needs in this buffer type (``ggml_backend_buft_get_alloc_size``)."""
        return lib.ggml_backend_buft_get_alloc_size(self.ptr, tensor.ptr)

    def alloc_buffer(self, size: int) -> "Buffer":
        """``ggml_backend_buft_alloc_buffer``: a new buffer of ``size`` bytes.
        Raises ValueError for a negative size or one above :attr:`max_size`, MemoryError on failure."""
        if size < 0 or size > self.max_size:
            raise ValueError(f"buffer size {size} is outside 0..{self.max_size}")
        ptr = lib.ggml_backend_buft_alloc_buffer(self.ptr, size)
        callbacks.raise_pending()  # a Python buffer type's alloc_buffer may have raised
        if ptr == ffi.NULL:
            raise MemoryError(f"{self.name}: could not allocate {size} bytes")
        return Buffer(ptr, owned=True, keep=self)

    def __repr__(self) -> str:
        return "<BufferType (closed)>" if self.closed else f"<BufferType {self.name}>"


class Buffer(CObject):
    """A backend buffer (``ggml_backend_buffer_t``): one block of memory of a buffer type.

    Owned buffers are freed with ``ggml_backend_buffer_free`` on :meth:`close`. ``keep`` is an
    object kept alive with the buffer (e.g. the NumPy array a host-pointer buffer wraps).
    """

    _kind = "buffer"
    _c_free = lib.ggml_backend_buffer_free

    def __init__(self, ptr: Any, *, owned: bool, keep: Any = None, owner: Any = None):
        super().__init__(ptr, owned=owned, owner=owner)
        self._keep = keep
        self._c_addr = ptr  # lets contexts recognise tensors of a closed buffer

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_buffer_name(self.ptr))

    @property
    def size(self) -> int:
        """Bytes (``ggml_backend_buffer_get_size``)."""
        return lib.ggml_backend_buffer_get_size(self.ptr)

    @property
    def base(self) -> int:
        """Address of the first byte (``ggml_backend_buffer_get_base``; 0 for empty buffers)."""
        if self.size == 0:
            return 0
        return int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(self.ptr)))

    @property
    def alignment(self) -> int:
        return lib.ggml_backend_buffer_get_alignment(self.ptr)

    @property
    def max_size(self) -> int:
        return lib.ggml_backend_buffer_get_max_size(self.ptr)

    @property
    def is_host(self) -> bool:
        return bool(lib.ggml_backend_buffer_is_host(self.ptr))

    @property
    def buffer_type(self) -> BufferType:
        return BufferType(lib.ggml_backend_buffer_get_type(self.ptr), owner=self)

    @property
    def usage(self) -> str:
        """``"any"``, ``"weights"`` or ``"compute"`` (``ggml_backend_buffer_get/set_usage``)."""
        u = lib.ggml_backend_buffer_get_usage(self.ptr)
        return next(k for k, v in BUFFER_USAGE.items() if v == u)

    @usage.setter
    def usage(self, value: str) -> None:
        if value not in BUFFER_USAGE:
            raise ValueError(f"usage must be one of {sorted(BUFFER_USAGE)}")
        lib.ggml_backend_buffer_set_usage(self.ptr, BUFFER_USAGE[value])

    def alloc_size(self, tensor: Tensor) -> int:
        return lib.ggml_backend_buffer_get_alloc_size(self.ptr, tensor.ptr)

    def clear(self, value: int = 0) -> None:
        """Set every byte to ``value`` (0..255; ``ggml_backend_buffer_clear``)."""
        if not 0 <= value <= 255:
            raise ValueError("clear value is a byte: 0..255")
        if self.size:
            lib.ggml_backend_buffer_clear(self.ptr, value)

    def reset(self) -> None:
        """``ggml_backend_buffer_reset`` (backend-specific tensor state)."""
        lib.ggml_backend_buffer_reset(self.ptr)

    @property
    def is_multi_buffer(self) -> bool:
        return bool(lib.ggml_backend_buffer_is_multi_buffer(self.ptr))

    @staticmethod
    def multi(buffers: list["Buffer"]) -> "Buffer":
        """``ggml_backend_multi_buffer_alloc_buffer``: one buffer made of ``buffers``, which it
        takes over (they are freed with it and must not be closed separately)."""
        if not buffers:
            raise ValueError("a multi-buffer needs at least one buffer")
        arr = ffi.new("ggml_backend_buffer_t[]", [b.ptr for b in buffers])
        ptr = lib.ggml_backend_multi_buffer_alloc_buffer(arr, len(buffers))
        for b in buffers:
            b._owned = False  # freed by the multi-buffer now
        return Buffer(ptr, owned=True, keep=buffers)

    def numpy(self) -> np.ndarray:
        """Zero-copy uint8 view of a host buffer's bytes; keeps the buffer alive.
        Raises ValueError for a device (non-host) buffer."""
        from .tensor import _ArrayOwner

        if not self.is_host:
            raise ValueError(f"buffer {self.name} is not in host memory")
        return np.asarray(_ArrayOwner(self.base, (self.size,), (1,), np.dtype(np.uint8), self))

    def __repr__(self) -> str:
        return "<Buffer (closed)>" if self.closed else f"<Buffer {self.name} {self.size} bytes {self.usage}>"


class Backend(CObject):
    """A backend (``ggml_backend_t``): a stream of work on one device. Owned."""

    _kind = "backend"
    _c_free = lib.ggml_backend_free

    def __init__(self, ptr: Any, *, owned: bool = True, keep: Any = None):
        super().__init__(ptr, owned=owned)
        self._keep = keep
        self._async_keep: list[Any] = []

    # --- construction helpers
    @classmethod
    def by_name(cls, name: str, params: str | None = None) -> "Backend":
        """``ggml_backend_init_by_name``; KeyError if no device has that name."""
        from .device import device_by_name

        return device_by_name(name).init(params)

    @classmethod
    def by_type(cls, type: int, params: str | None = None) -> "Backend":
        """``ggml_backend_init_by_type`` (``GGML_BACKEND_DEVICE_TYPE_*``); KeyError if none."""
        from .device import device_by_type

        return device_by_type(type).init(params)

    @classmethod
    def best(cls) -> "Backend":
        """``ggml_backend_init_best``: the first GPU, else integrated GPU, else the CPU."""
        ptr = lib.ggml_backend_init_best()
        if ptr == ffi.NULL:
            raise GGMLError("no backend could be initialised")
        return cls(ptr)

    # --- description
    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_name(self.ptr))

    @property
    def guid(self) -> bytes:
        """The 16-byte backend identifier (``ggml_backend_guid``)."""
        return bytes(ffi.buffer(lib.ggml_backend_guid(self.ptr), 16))

    @property
    def device(self) -> "Device":
        from .device import Device

        return Device(lib.ggml_backend_get_device(self.ptr))

    @property
    def default_buffer_type(self) -> BufferType:
        return BufferType(lib.ggml_backend_get_default_buffer_type(self.ptr), owner=self)

    @property
    def alignment(self) -> int:
        return lib.ggml_backend_get_alignment(self.ptr)

    @property
    def max_size(self) -> int:
        return lib.ggml_backend_get_max_size(self.ptr)

    def alloc_buffer(self, size: int) -> Buffer:
        """A buffer of the default buffer type (``ggml_backend_alloc_buffer``)."""
        return self.default_buffer_type.alloc_buffer(size)

    # --- capabilities
    def supports_op(self, op: Tensor) -> bool:
        """``ggml_backend_supports_op``: can this backend compute node ``op``?"""
        return self._supports_raw(op.ptr)

    def _supports_raw(self, p: Any) -> bool:
        return bool(lib.ggml_backend_supports_op(self.ptr, p))

    def supports_buft(self, buft: BufferType) -> bool:
        """``ggml_backend_supports_buft``: can it use tensors in buffers of ``buft``?"""
        return bool(lib.ggml_backend_supports_buft(self.ptr, buft.ptr))

    def offload_op(self, op: Tensor) -> bool:
        """``ggml_backend_offload_op``: worth moving this op's weights here?"""
        return bool(lib.ggml_backend_offload_op(self.ptr, op.ptr))

    # --- tensor data
    def tensor_set_async(self, tensor: Tensor, array: np.ndarray, offset: int = 0) -> None:
        """``ggml_backend_tensor_set_async``: copy ``array``'s bytes into ``tensor`` at byte
        ``offset``; ``array`` is kept alive until :meth:`synchronize`."""
        p = _tensor_with_data(tensor)
        a = np.ascontiguousarray(array)
        _check_range(tensor, offset, a.nbytes)
        self._async_keep.append(a)
        lib.ggml_backend_tensor_set_async(self.ptr, p, ffi.from_buffer(a), offset, a.nbytes)

    def tensor_get_async(self, tensor: Tensor, out: np.ndarray, offset: int = 0) -> None:
        """``ggml_backend_tensor_get_async``: copy bytes from ``tensor`` into the writable,
        C-contiguous ``out``; valid after :meth:`synchronize`."""
        p = _tensor_with_data(tensor)
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be a writable C-contiguous array")
        _check_range(tensor, offset, out.nbytes)
        self._async_keep.append(out)
        lib.ggml_backend_tensor_get_async(self.ptr, p, ffi.from_buffer(out), offset, out.nbytes)

    def synchronize(self) -> None:
        """Wait for all queued work (``ggml_backend_synchronize``)."""
        lib.ggml_backend_synchronize(self.ptr)
        self._async_keep.clear()

    @staticmethod
    def tensor_memset(tensor: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
        """``ggml_backend_tensor_memset``: set bytes [offset, offset+size) to ``value``."""
        p = _tensor_with_data(tensor)
        size = tensor.nbytes - offset if size is None else size
        _check_range(tensor, offset, size)
        if not 0 <= value <= 255:
            raise ValueError("memset value is a byte: 0..255")
        buf = tensor.buffer_ptr
        if buf.iface.memset_tensor == ffi.NULL:
            raise ValueError(f"buffer {_str(lib.ggml_backend_buffer_name(buf))} does not support memset")
        lib.ggml_backend_tensor_memset(p, value, offset, size)

    @staticmethod
    def tensor_copy(src: Tensor, dst: Tensor) -> None:
        """``ggml_backend_tensor_copy`` between any buffers; layouts must match."""
        ps, pd = _tensor_with_data(src), _tensor_with_data(dst)
        if not _same_layout(src, dst):
            raise ValueError("tensor_copy needs tensors of the same type, ne and nb")
        lib.ggml_backend_tensor_copy(ps, pd)

    def tensor_copy_async(self, dst_backend: "Backend", src: Tensor, dst: Tensor) -> None:
        """``ggml_backend_tensor_copy_async`` from this backend to ``dst_backend``."""
        ps, pd = _tensor_with_data(src), _tensor_with_data(dst)
        if not _same_layout(src, dst):
            raise ValueError("tensor_copy_async needs tensors of the same type, ne and nb")
        lib.ggml_backend_tensor_copy_async(self.ptr, dst_backend.ptr, ps, pd)

    # --- compute
    def graph_compute(self, graph: "Graph") -> None:
        """``ggml_backend_graph_compute`` (see :meth:`pyggml.graph.Graph.compute`)."""
        graph.compute(self)

    def graph_compute_async(self, graph: "Graph") -> None:
        """``ggml_backend_graph_compute_async``; call :meth:`synchronize` before reading results."""
        from . import callbacks
        from .graph import status_name

        graph._check_computable(self)
        status = lib.ggml_backend_graph_compute_async(self.ptr, graph.ptr)
        callbacks.raise_pending()
        if status != lib.GGML_STATUS_SUCCESS:
            raise GGMLError(f"graph compute failed: {status_name(status)}")

    def graph_plan(self, graph: "Graph") -> "GraphPlan":
        """``ggml_backend_graph_plan_create``. Raises ValueError if the backend has no plans
        (ggml would abort)."""
        if self.ptr.iface.graph_plan_create == ffi.NULL:
            raise ValueError(f"backend {self.name} does not support graph plans")
        graph._check_computable(self)
        return GraphPlan(lib.ggml_backend_graph_plan_create(self.ptr, graph.ptr), self, graph)

    def __repr__(self) -> str:
        return "<Backend (closed)>" if self.closed else f"<Backend {self.name}>"


class GraphPlan(CObject):
    """A backend's compiled plan of a graph (``ggml_backend_graph_plan_t``), owned."""

    _kind = "graph plan"

    def __init__(self, ptr: Any, backend: Backend, graph: "Graph"):
        super().__init__(ptr, owned=True, owner=backend)
        self._graph = graph

    def _free(self, ptr: Any) -> None:
        lib.ggml_backend_graph_plan_free(self._owner.ptr, ptr)

    def compute(self) -> None:
        """``ggml_backend_graph_plan_compute``; raises GGMLError on failure."""
        from .graph import status_name

        status = lib.ggml_backend_graph_plan_compute(self._owner.ptr, self.ptr)
        if status != lib.GGML_STATUS_SUCCESS:
            raise GGMLError(f"graph plan compute failed: {status_name(status)}")


class Event(CObject):
    """A synchronisation event of a device (``ggml_backend_event_t``), owned.

    Raises ValueError where the device or backend does not implement events (ggml would abort).
    """

    _kind = "event"

    def __init__(self, device: "Device"):
        ptr = lib.ggml_backend_event_new(device.ptr)
        if ptr == ffi.NULL:
            raise ValueError(f"device {device.name} does not support events")
        super().__init__(ptr, owned=True)
        self._device = device

    def _free(self, ptr: Any) -> None:
        lib.ggml_backend_event_free(ptr)

    def record(self, backend: Backend) -> None:
        """``ggml_backend_event_record``: mark the current point of ``backend``'s stream."""
        if backend.ptr.iface.event_record == ffi.NULL:
            raise ValueError(f"backend {backend.name} cannot record events")
        lib.ggml_backend_event_record(self.ptr, backend.ptr)

    def wait(self, backend: Backend) -> None:
        """``ggml_backend_event_wait``: make ``backend`` wait for this event."""
        if backend.ptr.iface.event_wait == ffi.NULL:
            raise ValueError(f"backend {backend.name} cannot wait for events")
        lib.ggml_backend_event_wait(backend.ptr, self.ptr)

    def synchronize(self) -> None:
        """``ggml_backend_event_synchronize``: block until the event has happened."""
        if self._device.ptr.iface.event_synchronize == ffi.NULL:
            raise ValueError(f"device {self._device.name} cannot synchronize events")
        lib.ggml_backend_event_synchronize(self.ptr)
