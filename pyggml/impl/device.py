"""Devices written in Python (``struct ggml_backend_device``)."""
from __future__ import annotations

import abc
from typing import Any

from ..memory.buffer_type import BufferType
from ..enums import DeviceType, member
from ..raw import ffi, lib
from ..core.tensor import Tensor
from ._vtable import LIVE, Impl, addr, lent, make_struct
from .backend import PyBackend
from .buffer import PyBufferType

__all__ = ["PyDevice"]


def _buft_ptr(buft: Any) -> Any:
    if isinstance(buft, (PyBufferType, BufferType)):
        return buft.ptr
    raise TypeError(f"a buffer type must be a PyBufferType or a pyggml BufferType, not {type(buft).__name__}")


class PyDevice(Impl):
    """A device (``struct ggml_backend_device``).

    Required: :meth:`get_name`, :meth:`get_description`, :meth:`init_backend`,
    :meth:`get_buffer_type`, :meth:`supports_op`. Defaults: ``get_memory`` (0, 0),
    ``get_type`` ``DeviceType.ACCEL`` (not ``CPU``: a scheduler needs its CPU last, and
    test-backend-ops skips CPU devices), ``get_props`` (from the others), ``supports_buft``
    (its own buffer type, and any host buffer type if its own is host).
    Optional: ``offload_op(op) -> bool``, ``get_host_buffer_type()``, and events:
    ``event_new() -> object`` (any Python object standing for the event), ``event_free(event)``,
    ``event_synchronize(event)`` (``caps.events`` is then reported true). ``async_copies``
    (class attribute, default False): report ``caps.async``, for a device whose backends
    implement the asynchronous slots (``PyBackend.set_tensor_async``...).

    The name, description, type and buffer types are read once, when the device's registry is
    made (:class:`~pyggml.impl.PyRegistry`): ggml keeps the pointers and cannot survive a NULL
    one. The buffer types are kept alive with the device. Tensors passed to the methods are
    valid during the call only.
    """

    _iface = "ggml_backend_device_i"
    _struct = "ggml_backend_device"
    _frozen = False
    async_copies = False

    def __init__(self) -> None:
        make_struct(self)

    def _freeze(self) -> None:
        """Read what ggml keeps pointers to (called by the registry, in Python, where an
        exception is an ordinary exception)."""
        self._name = self._cstr(self.get_name())
        self._description = self._cstr(self.get_description())
        self._type = member(DeviceType, self.get_type())
        self._buft = self.get_buffer_type()  # kept alive: ggml holds its pointer
        self._buft_ptr = _buft_ptr(self._buft)
        host = getattr(self, "get_host_buffer_type", None)
        self._host_buft = host() if callable(host) else None
        self._host_buft_ptr = _buft_ptr(self._host_buft) if self._host_buft is not None else ffi.NULL
        self._frozen = True

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

    def get_type(self) -> DeviceType | str:
        """A :class:`~pyggml.enums.DeviceType` (or its name: ``"gpu"``, ``"igpu"``,
        ``"accel"``, ``"cpu"``)."""
        return DeviceType.ACCEL

    def supports_buft(self, buft: BufferType) -> bool:
        """Whether the device's backends can use buffers of ``buft``: its own buffer type, and
        any host buffer type if its own is host."""
        own = self._buft_ptr
        if addr(buft.ptr) == addr(own):
            return True
        return bool(lib.ggml_backend_buft_is_host(own)) and buft.is_host

    def _implements(self, member: str) -> bool:
        if member == "event_free":  # always filled with events: it releases the C struct
            return callable(getattr(self, "event_new", None))
        return member in ("get_memory", "get_type", "get_props", "supports_buft") or callable(getattr(self, member, None))

    def _c_get_name(self, d: Any) -> Any:
        return self._name

    def _c_get_description(self, d: Any) -> Any:
        return self._description

    def _c_get_memory(self, d: Any, free: Any, total: Any) -> None:
        free[0], total[0] = 0, 0
        free[0], total[0] = self.get_memory()

    def _c_get_type(self, d: Any) -> int:
        return int(self._type)

    def _c_get_props(self, d: Any, props: Any) -> None:
        props.name = self._name
        props.description = self._description
        props.type = int(self._type)
        props.device_id = ffi.NULL
        setattr(props.caps, "async", bool(self.async_copies))
        props.caps.host_buffer = self._host_buft is not None
        props.caps.buffer_from_host_ptr = False
        props.caps.events = callable(getattr(self, "event_new", None))
        props.memory_free, props.memory_total = self.get_memory()

    def _c_init_backend(self, d: Any, params: Any) -> Any:
        backend = self.init_backend(None if params == ffi.NULL else ffi.string(params).decode())
        if not isinstance(backend, PyBackend):
            raise TypeError(f"init_backend must return a PyBackend, not {type(backend).__name__}")
        LIVE[addr(backend._c)] = backend
        return backend._c

    def _c_get_buffer_type(self, d: Any) -> Any:
        return self._buft_ptr

    def _c_get_host_buffer_type(self, d: Any) -> Any:
        return self._host_buft_ptr

    def _c_supports_op(self, d: Any, op: Any) -> bool:
        with lent("supports_op") as scope:
            return bool(self.supports_op(Tensor(op, scope)))

    def _c_supports_buft(self, d: Any, buft: Any) -> bool:
        return bool(self.supports_buft(BufferType(buft)))

    def _c_offload_op(self, d: Any, op: Any) -> bool:
        with lent("offload_op") as scope:
            return bool(self.offload_op(Tensor(op, scope)))  # type: ignore[attr-defined]

    def _c_event_new(self, d: Any) -> Any:
        obj = self.event_new()  # type: ignore[attr-defined]
        c = ffi.new("struct ggml_backend_event *")
        handle = ffi.new_handle(obj)
        c.device, c.context = d, handle
        LIVE[addr(c)] = (c, handle, obj)
        return c

    def _c_event_free(self, d: Any, event: Any) -> None:
        try:
            if callable(getattr(self, "event_free", None)):
                self.event_free(ffi.from_handle(event.context))  # type: ignore[attr-defined]
        finally:
            LIVE.pop(addr(event), None)

    def _c_event_synchronize(self, d: Any, event: Any) -> None:
        self.event_synchronize(ffi.from_handle(event.context))  # type: ignore[attr-defined]

