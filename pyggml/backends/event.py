"""Synchronisation events of a device (``ggml_backend_event_t``).

An :class:`Event` is owned (``ggml_backend_event_free``) and keeps its device alive. Devices and
backends that do not implement events raise ValueError where ggml would abort.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _cobject
from ..raw import ffi, lib
from ..raw.boundary import calling

if TYPE_CHECKING:
    from .backend import Backend
    from .device import Device

__all__ = ["Event"]


class Event(_cobject.CObject):
    """``ggml_backend_event_new(device)``, owned. Raises ValueError if the device has no events."""

    _kind = "event"

    def __init__(self, device: "Device"):
        with calling():
            ptr = lib.ggml_backend_event_new(device.ptr)
        if ptr == ffi.NULL:
            raise ValueError(f"device {device.name} does not support events")
        super().__init__(ptr, owned=True, keep=device)
        self._device = device

    def _free(self, ptr: Any) -> None:
        with calling():
            lib.ggml_backend_event_free(ptr)

    def record(self, backend: "Backend") -> None:
        """``ggml_backend_event_record``: mark the current point of ``backend``'s stream."""
        if backend.ptr.iface.event_record == ffi.NULL:
            raise ValueError(f"backend {backend.name} cannot record events")
        with calling():
            lib.ggml_backend_event_record(self.ptr, backend.ptr)

    def wait(self, backend: "Backend") -> None:
        """``ggml_backend_event_wait``: make ``backend`` wait for this event."""
        if backend.ptr.iface.event_wait == ffi.NULL:
            raise ValueError(f"backend {backend.name} cannot wait for events")
        with calling():
            lib.ggml_backend_event_wait(backend.ptr, self.ptr)

    def synchronize(self) -> None:
        """``ggml_backend_event_synchronize``: block until the event has happened."""
        if self._device.ptr.iface.event_synchronize == ffi.NULL:
            raise ValueError(f"device {self._device.name} cannot synchronize events")
        with calling():
            lib.ggml_backend_event_synchronize(self.ptr)
