"""Write ggml backends in Python: the five interfaces of ggml-backend-impl.h as base classes.

Subclass :class:`PyRegistry`, :class:`PyDevice`, :class:`PyBufferType`, :class:`PyBuffer` (or
use :class:`HostBuffer`) and :class:`PyBackend`; pyggml fills ggml's C vtables with its generated
``extern "Python"`` trampolines. A slot whose method the subclass does not define stays NULL, so
ggml's own fallback applies (e.g. no ``synchronize``: a synchronous backend). Abstract methods
are the slots ggml calls unconditionally. ``api_version`` is ``GGML_BACKEND_API_VERSION``.

Methods receive pyggml objects: :class:`~pyggml.tensor.Tensor` (``ne``, ``nb``, ``op``,
``src``, ``op_params`` and ``params``, the op parameters decoded per op;
:func:`pyggml.ops.host_array` gives a NumPy view of host data),
:class:`~pyggml.graph.Graph`, :class:`~pyggml.backend.BufferType`, ``memoryview`` for raw bytes.

**Failures**: an exception in any method is logged with its traceback (logger
``pyggml.callbacks``), becomes that slot's failure value (``graph_compute`` →
``GGML_STATUS_FAILED``, allocation → NULL, ``supports_op`` → false...) and is re-raised by the
pyggml call that made ggml call the method (``Graph.compute``, ``Scheduler.compute``...).

**Lifetimes**: a registered registry, its devices and buffer types live until
:func:`unregister` or interpreter exit, where the registration is undone before Python tears
down. Backends and buffers live until ggml frees them (``free``/``free_buffer``).

**Threads**: every callback takes the GIL; computing from any thread works.
"""
from __future__ import annotations

import abc
import atexit
import uuid
from typing import Any, Sequence

from . import callbacks
from ._loader import ffi, lib
from .backend import BufferType
from .device import DEVICE_TYPES
from .graph import Graph
from .tensor import Tensor

__all__ = ["PyRegistry", "PyDevice", "PyBufferType", "PyBuffer", "HostBuffer", "PyBackend",
           "register", "unregister", "DEVICE_TYPES"]


# objects ggml holds raw pointers to: kept alive here until ggml frees them
_LIVE: dict[int, Any] = {}
_REGISTERED: list["PyRegistry"] = []


def _addr(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


def _tensor(p: Any) -> Tensor:
    return Tensor(p, None)  # type: ignore[arg-type]  # borrowed from whoever made it


def _event(p: Any) -> Any:
    """The Python object a PyDevice's ``event_new`` returned for C event ``p``."""
    return ffi.from_handle(p.context)


class _Impl(abc.ABC):
    """Common plumbing: a Python-owned C struct whose ``context`` is a handle to ``self`` and
    whose ``iface`` holds a trampoline for each slot ``self`` implements (``_c_<slot>``)."""

    _iface: str = ""
    _struct: str = ""

    def _implements(self, member: str) -> bool:
        """A slot is filled when the Python method behind it exists (abstract ones always do)."""
        return callable(getattr(self, member, None))

    def _cstr(self, s: str) -> Any:
        if s not in self._strings:  # ggml keeps the pointer: keep the bytes alive
            self._strings[s] = ffi.new("char[]", s.encode())
        return self._strings[s]


class _SlotRouter:
    """The object behind a C struct's ``context`` handle: slot name -> ``impl._c_<slot>``."""

    def __init__(self, impl: _Impl):
        self.impl = impl

    def __getattr__(self, member: str) -> Any:
        return getattr(self.impl, "_c_" + member)


def _fill(impl: _Impl, iface: Any) -> None:
    """Give ``impl`` its context handle and put a trampoline in each slot of ``iface`` (a
    ``struct <impl._iface>``) that ``impl`` implements; the other slots stay NULL."""
    impl._router = _SlotRouter(impl)
    impl._handle = ffi.new_handle(impl._router)
    impl._strings = {}
    for member, _ in ffi.typeof(f"struct {impl._iface}").fields:
        if impl._implements(member):
            setattr(iface, member, callbacks.slot(impl._iface, member))


def _make(impl: _Impl) -> Any:
    c = ffi.new(f"struct {impl._struct} *")
    impl._c = c
    _fill(impl, c.iface)
    c.context = impl._handle
    return c


# ============================================================================ buffers
class PyBuffer(_Impl):
    """A buffer (``struct ggml_backend_buffer``), made by :meth:`PyBufferType.alloc_buffer`.

    Required: :meth:`get_base` (an address: ggml computes tensor addresses from it),
    :meth:`set_tensor`, :meth:`get_tensor`, :meth:`clear`. Optional: ``free_buffer()``,
    ``init_tensor(tensor)``, ``memset_tensor(tensor, value, offset, size)``,
    ``cpy_tensor(src, dst) -> bool``, ``reset()``.
    """

    _iface = "ggml_backend_buffer_i"

    @abc.abstractmethod
    def get_base(self) -> int:
        """Address of the buffer's first byte (``tensor.data`` = base + offset)."""

    @abc.abstractmethod
    def set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        """Copy ``data`` (bytes) into ``tensor`` starting ``offset`` bytes into its data."""

    @abc.abstractmethod
    def get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        """Fill ``out`` (writable bytes) from ``tensor``'s data at byte ``offset``."""

    @abc.abstractmethod
    def clear(self, value: int) -> None:
        """Set every byte of the buffer to ``value``."""

    # --- C side (buffer struct is made by ggml_backend_buffer_init and deleted by ggml)
    def _init_c(self, buft_ptr: Any, size: int) -> Any:
        iface = ffi.new("struct ggml_backend_buffer_i *")
        _fill(self, iface)
        iface.free_buffer = callbacks.slot("ggml_backend_buffer_i", "free_buffer")  # always: releases us
        ptr = lib.ggml_backend_buffer_init(buft_ptr, iface[0], self._handle, size)
        _LIVE[_addr(ptr)] = self
        self.size = size
        return ptr

    def _c_free_buffer(self, buf: Any) -> None:
        try:
            if callable(getattr(self, "free_buffer", None)):
                self.free_buffer()
        finally:
            _LIVE.pop(_addr(buf), None)

    def _c_get_base(self, buf: Any) -> Any:
        return ffi.cast("void *", self.get_base())

    def _c_init_tensor(self, buf: Any, t: Any) -> int:
        self.init_tensor(_tensor(t))
        return lib.GGML_STATUS_SUCCESS

    def _c_memset_tensor(self, buf: Any, t: Any, value: int, offset: int, size: int) -> None:
        self.memset_tensor(_tensor(t), value, offset, size)

    def _c_set_tensor(self, buf: Any, t: Any, data: Any, offset: int, size: int) -> None:
        self.set_tensor(_tensor(t), memoryview(ffi.buffer(data, size)), offset)

    def _c_get_tensor(self, buf: Any, t: Any, data: Any, offset: int, size: int) -> None:
        self.get_tensor(_tensor(t), memoryview(ffi.buffer(data, size)), offset)

    def _c_cpy_tensor(self, buf: Any, src: Any, dst: Any) -> bool:
        return bool(self.cpy_tensor(_tensor(src), _tensor(dst)))

    def _c_clear(self, buf: Any, value: int) -> None:
        self.clear(value)

    def _c_reset(self, buf: Any) -> None:
        self.reset()


class HostBuffer(PyBuffer):
    """A buffer in host memory owned by NumPy (``bytearray``-like, 64-byte aligned)."""

    def __init__(self, size: int):
        from .cpu import aligned_zeros

        self.array = aligned_zeros(max(size, 1), "uint8")

    def get_base(self) -> int:
        return self.array.__array_interface__["data"][0]

    def _offset(self, tensor: Tensor, offset: int, size: int) -> int:
        start = _addr(tensor.ptr.data) - self.get_base() + offset
        if start < 0 or start + size > self.array.size:
            raise ValueError("access outside the buffer")
        return start

    def set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        start = self._offset(tensor, offset, data.nbytes)
        self.array[start:start + data.nbytes] = data.cast("B")

    def get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        start = self._offset(tensor, offset, out.nbytes)
        out.cast("B")[:] = self.array[start:start + out.nbytes].data

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        start = self._offset(tensor, offset, size)
        self.array[start:start + size] = value

    def clear(self, value: int) -> None:
        self.array[:] = value


class PyBufferType(_Impl):
    """A buffer type (``struct ggml_backend_buffer_type``).

    Required: :meth:`get_name`, :meth:`alloc_buffer`. Defaults: :meth:`get_alignment` 32.
    Optional: ``get_max_size() -> int``, ``get_alloc_size(tensor) -> int``,
    ``is_host() -> bool`` (True lets the CPU backend read these buffers in place).
    """

    _iface = "ggml_backend_buffer_type_i"
    _struct = "ggml_backend_buffer_type"

    def __init__(self) -> None:
        _make(self)

    @abc.abstractmethod
    def get_name(self) -> str:
        """Name of the buffer type."""

    @abc.abstractmethod
    def alloc_buffer(self, size: int) -> PyBuffer:
        """A new buffer of ``size`` bytes."""

    def get_alignment(self) -> int:
        """Alignment of tensor data in bytes (default 32)."""
        return 32

    @property
    def ptr(self) -> Any:
        """The ``ggml_backend_buffer_type_t`` to hand to ggml."""
        return self._c

    def as_buffer_type(self) -> BufferType:
        """This buffer type as a pyggml :class:`~pyggml.backend.BufferType`."""
        return BufferType(self._c, owner=None)

    def _c_get_name(self, buft: Any) -> Any:
        return self._cstr(self.get_name())

    def _c_alloc_buffer(self, buft: Any, size: int) -> Any:
        buf = self.alloc_buffer(size)
        if not isinstance(buf, PyBuffer):
            raise TypeError(f"alloc_buffer must return a PyBuffer, not {type(buf).__name__}")
        return buf._init_c(buft, size)

    def _c_get_alignment(self, buft: Any) -> int:
        return self.get_alignment()

    def _c_get_max_size(self, buft: Any) -> int:
        return self.get_max_size()

    def _c_get_alloc_size(self, buft: Any, t: Any) -> int:
        return self.get_alloc_size(_tensor(t))

    def _c_is_host(self, buft: Any) -> bool:
        return bool(self.is_host())


# ============================================================================ backend
class PyBackend(_Impl):
    """A backend (``struct ggml_backend``), made by :meth:`PyDevice.init_backend`.

    Required: :meth:`graph_compute`. Defaults: ``get_name`` (the device's name), ``free``.
    Optional: ``synchronize()``, ``graph_optimize(graph)``,
    ``set_tensor_async(tensor, data, offset)``, ``get_tensor_async(tensor, out, offset)``,
    ``cpy_tensor_async(backend_src, src, dst) -> bool``, and with device events
    ``event_record(event)`` / ``event_wait(event)`` (``event``: what ``PyDevice.event_new``
    returned).
    """

    _iface = "ggml_backend_i"
    _struct = "ggml_backend"

    def __init__(self, device: "PyDevice"):
        self.device = device
        c = _make(self)
        self._guid = ffi.new("ggml_guid *", list(uuid.uuid5(uuid.NAMESPACE_URL, f"pyggml:{type(self).__qualname__}").bytes))
        c.guid = self._guid
        c.device = device._c

    @abc.abstractmethod
    def graph_compute(self, graph: Graph) -> None:
        """Compute every node of ``graph`` (a view of the nodes assigned to this backend; skip
        ``is_empty_op()`` nodes and those without ``GGML_TENSOR_FLAG_COMPUTE``). Raise to fail."""

    def get_name(self) -> str:
        return self.device.get_name()

    def free(self) -> None:
        """Called when ggml frees the backend (``ggml_backend_free``); release resources here."""

    def _implements(self, member: str) -> bool:
        return member in ("get_name", "free") or callable(getattr(self, member, None))

    def _c_get_name(self, b: Any) -> Any:
        return self._cstr(self.get_name())

    def _c_free(self, b: Any) -> None:
        try:
            self.free()
        finally:
            _LIVE.pop(_addr(b), None)

    def _c_graph_compute(self, b: Any, cgraph: Any) -> int:
        self.graph_compute(Graph(cgraph, None, lib.ggml_graph_n_nodes(cgraph)))  # type: ignore[arg-type]
        return lib.GGML_STATUS_SUCCESS

    def _c_graph_optimize(self, b: Any, cgraph: Any) -> None:
        self.graph_optimize(Graph(cgraph, None, lib.ggml_graph_n_nodes(cgraph)))  # type: ignore[arg-type]

    def _c_synchronize(self, b: Any) -> None:
        self.synchronize()

    def _c_set_tensor_async(self, b: Any, t: Any, data: Any, offset: int, size: int) -> None:
        self.set_tensor_async(_tensor(t), memoryview(ffi.buffer(data, size)), offset)

    def _c_get_tensor_async(self, b: Any, t: Any, data: Any, offset: int, size: int) -> None:
        self.get_tensor_async(_tensor(t), memoryview(ffi.buffer(data, size)), offset)

    def _c_cpy_tensor_async(self, src_b: Any, dst_b: Any, src: Any, dst: Any) -> bool:
        return bool(self.cpy_tensor_async(src_b, _tensor(src), _tensor(dst)))

    def _c_event_record(self, b: Any, event: Any) -> None:
        self.event_record(_event(event))

    def _c_event_wait(self, b: Any, event: Any) -> None:
        self.event_wait(_event(event))


# ============================================================================ device
class PyDevice(_Impl):
    """A device (``struct ggml_backend_device``).

    Required: :meth:`get_name`, :meth:`get_description`, :meth:`init_backend`,
    :meth:`get_buffer_type`, :meth:`supports_op`. Defaults: ``get_memory`` (0, 0),
    ``get_type`` ``"accel"`` (not ``"cpu"``: a scheduler needs its CPU last, and
    test-backend-ops skips CPU devices), ``get_props`` (from the others), ``supports_buft``
    (its own buffer type, and any host buffer type if its own is host).
    Optional: ``offload_op(op) -> bool``, ``get_host_buffer_type()``, and events:
    ``event_new() -> object`` (any Python object standing for the event), ``event_free(event)``,
    ``event_synchronize(event)`` (``caps.events`` is then reported true).
    """

    _iface = "ggml_backend_device_i"
    _struct = "ggml_backend_device"

    def __init__(self) -> None:
        _make(self)
        self._props_strings: list[Any] = []

    @abc.abstractmethod
    def get_name(self) -> str:
        """Device name (what ``device_by_name`` and ``test-backend-ops -b`` match)."""

    @abc.abstractmethod
    def get_description(self) -> str:
        """One line describing the device."""

    @abc.abstractmethod
    def init_backend(self, params: str | None) -> PyBackend:
        """A new backend (stream) on this device."""

    @abc.abstractmethod
    def get_buffer_type(self) -> "PyBufferType | BufferType":
        """The device's default buffer type (a Python one, or e.g. ``cpu_buffer_type()``)."""

    @abc.abstractmethod
    def supports_op(self, op: Tensor) -> bool:
        """Whether the backend computes ``op`` correctly (be honest: ggml trusts this)."""

    def get_memory(self) -> tuple[int, int]:
        """(free, total) bytes."""
        return 0, 0

    def get_type(self) -> str:
        """``"gpu"``, ``"igpu"``, ``"accel"`` or ``"cpu"``."""
        return "accel"

    def supports_buft(self, buft: BufferType) -> bool:
        own = self.get_buffer_type()
        own_ptr = own.ptr
        if _addr(buft.ptr) == _addr(own_ptr):
            return True
        return bool(lib.ggml_backend_buft_is_host(own_ptr)) and buft.is_host

    def _implements(self, member: str) -> bool:
        if member == "event_free":  # always filled with events: it releases the C struct
            return callable(getattr(self, "event_new", None))
        return member in ("get_memory", "get_type", "get_props", "supports_buft") or callable(getattr(self, member, None))

    def _c_get_name(self, d: Any) -> Any:
        return self._cstr(self.get_name())

    def _c_get_description(self, d: Any) -> Any:
        return self._cstr(self.get_description())

    def _c_get_memory(self, d: Any, free: Any, total: Any) -> None:
        free[0], total[0] = self.get_memory()

    def _c_get_type(self, d: Any) -> int:
        return DEVICE_TYPES[self.get_type()]

    def _c_get_props(self, d: Any, props: Any) -> None:
        props.name = self._cstr(self.get_name())
        props.description = self._cstr(self.get_description())
        props.memory_free, props.memory_total = self.get_memory()
        props.type = DEVICE_TYPES[self.get_type()]
        props.device_id = ffi.NULL
        setattr(props.caps, "async", callable(getattr(self, "set_tensor_async", None)))
        props.caps.host_buffer = False
        props.caps.buffer_from_host_ptr = False
        props.caps.events = callable(getattr(self, "event_new", None))

    def _c_init_backend(self, d: Any, params: Any) -> Any:
        backend = self.init_backend(None if params == ffi.NULL else ffi.string(params).decode())
        if not isinstance(backend, PyBackend):
            raise TypeError(f"init_backend must return a PyBackend, not {type(backend).__name__}")
        _LIVE[_addr(backend._c)] = backend
        return backend._c

    def _c_get_buffer_type(self, d: Any) -> Any:
        return self.get_buffer_type().ptr

    def _c_get_host_buffer_type(self, d: Any) -> Any:
        return self.get_host_buffer_type().ptr

    def _c_supports_op(self, d: Any, op: Any) -> bool:
        return bool(self.supports_op(_tensor(op)))

    def _c_supports_buft(self, d: Any, buft: Any) -> bool:
        return bool(self.supports_buft(BufferType(buft, owner=None)))

    def _c_offload_op(self, d: Any, op: Any) -> bool:
        return bool(self.offload_op(_tensor(op)))

    def _c_event_new(self, d: Any) -> Any:
        obj = self.event_new()
        c = ffi.new("struct ggml_backend_event *")
        handle = ffi.new_handle(obj)
        c.device, c.context = d, handle
        _LIVE[_addr(c)] = (c, handle, obj)
        return c

    def _c_event_free(self, d: Any, event: Any) -> None:
        try:
            if callable(getattr(self, "event_free", None)):
                self.event_free(_event(event))
        finally:
            _LIVE.pop(_addr(event), None)

    def _c_event_synchronize(self, d: Any, event: Any) -> None:
        self.event_synchronize(_event(event))


# ============================================================================ registry
class PyRegistry(_Impl):
    """A backend registry (``struct ggml_backend_reg``): a name and its devices.

    Optional: ``get_proc_address(name) -> cdata | None``.
    """

    _iface = "ggml_backend_reg_i"
    _struct = "ggml_backend_reg"

    def __init__(self, name: str, devices: Sequence[PyDevice]):
        self.name = name
        self.devices = list(devices)
        c = _make(self)
        c.api_version = lib.GGML_BACKEND_API_VERSION
        for d in self.devices:
            d._c.reg = c
            buft = d.get_buffer_type()
            if isinstance(buft, PyBufferType):
                buft._c.device = d._c

    @property
    def ptr(self) -> Any:
        """The ``ggml_backend_reg_t`` to hand to ggml."""
        return self._c

    def get_name(self) -> str:
        return self.name

    def _implements(self, member: str) -> bool:
        return member != "get_proc_address" or callable(getattr(self, "get_proc_address", None))

    def _c_get_name(self, r: Any) -> Any:
        return self._cstr(self.get_name())

    def _c_get_device_count(self, r: Any) -> int:
        return len(self.devices)

    def _c_get_device(self, r: Any, index: int) -> Any:
        return self.devices[index]._c

    def _c_get_proc_address(self, r: Any, name: Any) -> Any:
        p = self.get_proc_address(ffi.string(name).decode())
        return ffi.NULL if p is None else ffi.cast("void *", p)


def register(reg: PyRegistry) -> None:
    """``ggml_backend_register``: add ``reg`` and its devices to ggml's registry, where
    ``device_by_name``, schedulers and ``Backend.by_name`` find them. Undone by
    :func:`unregister` or at interpreter exit."""
    if any(r is reg for r in _REGISTERED):
        raise ValueError(f"registry {reg.name!r} is already registered")
    lib.ggml_backend_register(reg._c)
    _REGISTERED.append(reg)


def unregister(reg: PyRegistry) -> None:
    """``ggml_backend_unload``: remove ``reg`` and its devices from ggml's registry."""
    if not any(r is reg for r in _REGISTERED):
        raise ValueError(f"registry {reg.name!r} is not registered")
    lib.ggml_backend_unload(reg._c)
    _REGISTERED[:] = [r for r in _REGISTERED if r is not reg]


@atexit.register
def _unregister_all() -> None:
    for reg in list(_REGISTERED):
        unregister(reg)
