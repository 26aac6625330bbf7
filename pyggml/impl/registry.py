"""Backend registries written in Python (``struct ggml_backend_reg``), and registering them in
ggml's global registry."""
from __future__ import annotations

import atexit
from typing import Any, Sequence

from ..raw import ffi, lib
from ..raw.boundary import calling
from ._vtable import Impl, make_struct
from .buffer import PyBufferType
from .device import PyDevice

__all__ = ["PyRegistry", "register", "unregister"]

_REGISTERED: list["PyRegistry"] = []


class PyRegistry(Impl):
    """A backend registry (``struct ggml_backend_reg``): a name and its devices (fixed when it
    is made; the registry keeps them alive).

    Optional: ``get_proc_address(name) -> cdata | None``.
    """

    _iface = "ggml_backend_reg_i"
    _struct = "ggml_backend_reg"

    def __init__(self, name: str, devices: Sequence[PyDevice]):
        self.name = name
        self.devices = tuple(devices)
        for d in self.devices:
            if not isinstance(d, PyDevice):
                raise TypeError(f"a PyRegistry holds PyDevices, not {type(d).__name__}")
            d._freeze()
        c = make_struct(self)
        c.api_version = lib.GGML_BACKEND_API_VERSION
        self._name = self._cstr(name)
        for d in self.devices:
            d._c.reg = c
            if isinstance(d._buft, PyBufferType):
                d._buft._c.device = d._c

    @property
    def ptr(self) -> Any:
        """The ``ggml_backend_reg_t`` to hand to ggml."""
        return self._c

    def get_name(self) -> str:
        """The registry's name."""
        return self.name

    def _implements(self, member: str) -> bool:
        return member != "get_proc_address" or callable(getattr(self, "get_proc_address", None))

    def _c_get_name(self, r: Any) -> Any:
        return self._name

    def _c_get_device_count(self, r: Any) -> int:
        return len(self.devices)

    def _c_get_device(self, r: Any, index: int) -> Any:
        return self.devices[index]._c if 0 <= index < len(self.devices) else ffi.NULL

    def _c_get_proc_address(self, r: Any, name: Any) -> Any:
        p = self.get_proc_address(ffi.string(name).decode())  # type: ignore[attr-defined]
        return ffi.NULL if p is None else ffi.cast("void *", p)


def register(reg: PyRegistry) -> None:
    """``ggml_backend_register``: add ``reg`` and its devices to ggml's registry, where
    ``device_by_name``, schedulers and ``Backend.by_name`` find them. Undone by
    :func:`unregister` or at interpreter exit (the registration keeps ``reg`` alive)."""
    if any(r is reg for r in _REGISTERED):
        raise ValueError(f"registry {reg.name!r} is already registered")
    with calling():
        lib.ggml_backend_register(reg._c)
    _REGISTERED.append(reg)


def unregister(reg: PyRegistry) -> None:
    """``ggml_backend_unload``: remove ``reg`` and its devices from ggml's registry."""
    if not any(r is reg for r in _REGISTERED):
        raise ValueError(f"registry {reg.name!r} is not registered")
    with calling():
        lib.ggml_backend_unload(reg._c)
    _REGISTERED[:] = [r for r in _REGISTERED if r is not reg]


@atexit.register
def _unregister_all() -> None:
    for reg in list(_REGISTERED):
        unregister(reg)
