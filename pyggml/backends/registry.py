"""Backend registries (``ggml_backend_reg_t``): one backend library and its devices; loading
and unloading backend modules.

Registries belong to ggml's global registry: :class:`Registry` borrows them. Registries loaded
from a library (:func:`load_backend`) are removed with :func:`unload_backend`. The backend
modules of the build itself are loaded at import (:mod:`pyggml.raw.dl`).
"""
from __future__ import annotations

import ctypes
import datetime
import os
import sys
from pathlib import Path
from typing import Any

from .. import _cobject
from .device import Device
from ..errors import BackendNotAvailableError, GGMLError
from ..raw import LIB_DIR, dl, ffi, lib
from ..raw.boundary import calling

__all__ = ["Registry", "registries", "registry_by_name", "load_backend", "unload_backend", "load_all"]


def _str(p: Any) -> str:
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


class Registry(_cobject.CObject):
    """A backend registry, borrowed from ggml's global registry."""

    _kind = "registry"

    def __init__(self, ptr: Any):
        super().__init__(ptr, owned=False)

    @classmethod
    def of(cls, device: Device) -> "Registry":
        """The registry (backend library) ``device`` belongs to (``ggml_backend_dev_backend_reg``).
        Raises TypeError for anything but a :class:`Device`, ClosedError for a closed one."""
        if not isinstance(device, Device):
            raise TypeError(f"Registry.of takes a Device, not {type(device).__name__}")
        with calling():
            return cls(lib.ggml_backend_dev_backend_reg(device.ptr))

    @property
    def name(self) -> str:
        """``ggml_backend_reg_name`` (``"CPU"``, ``"CUDA"``...)."""
        with calling():
            return _str(lib.ggml_backend_reg_name(self.ptr))

    @property
    def devices(self) -> list[Device]:
        """``ggml_backend_reg_dev_count`` / ``_dev_get``."""
        r = self.ptr
        with calling():
            return [Device(lib.ggml_backend_reg_dev_get(r, i)) for i in range(lib.ggml_backend_reg_dev_count(r))]

    def get_proc_address(self, name: str, ctype: str | None = None) -> Any:
        """``ggml_backend_reg_get_proc_address``: the backend-specific function ``name`` cast to
        ``ctype`` (e.g. ``"ggml_backend_set_n_threads_t"``), or None if it does not exist."""
        with calling():
            p = lib.ggml_backend_reg_get_proc_address(self.ptr, name.encode())
        if p == ffi.NULL:
            return None
        return ffi.cast(ctype, p) if ctype else p

    def __repr__(self) -> str:
        return f"<Registry {self.name}: {len(self.devices)} device(s)>"


def registries() -> list[Registry]:
    """Every registered backend registry (``ggml_backend_reg_count/get``)."""
    return [Registry(lib.ggml_backend_reg_get(i)) for i in range(lib.ggml_backend_reg_count())]


def registry_by_name(name: str) -> Registry:
    """``ggml_backend_reg_by_name``. Raises :class:`~pyggml.errors.BackendNotAvailableError`
    (a KeyError) saying why the registry is missing."""
    with calling():
        p = lib.ggml_backend_reg_by_name(name.encode())
    if p == ffi.NULL:
        raise BackendNotAvailableError(
            f"no ggml backend registry named {name!r} (registries: "
            f"{', '.join(r.name for r in registries())}): {dl.explain(name)}")
    return Registry(p)


def _unlock_cffi_embedding() -> None:
    """Let a cffi-embedding module (e.g. from ``python -m pyggml.impl.module``) start in this process.

    On Python < 3.12 cffi's embedding start-up spins until ``PyCapsule_Type.tp_version_tag`` is
    0 (it uses it as a lock), but any attribute lookup on a capsule object gives the type a
    version tag: the load would hang forever. ``PyType_Modified`` resets the tag (it only
    invalidates the method cache entries of the capsule type)."""
    if sys.version_info < (3, 12):
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(type(datetime.datetime_CAPI)))


_pinned: list[Any] = []


def load_backend(path: str | Path) -> Registry:
    """``ggml_backend_load``: load a backend module (a shared library exporting
    ``ggml_backend_init``) and register it. Raises FileNotFoundError or GGMLError.

    The library is marked ``RTLD_NODELETE``: :func:`unload_backend` unregisters it, but its code
    stays mapped. A module implemented in Python (``python -m pyggml.impl.module``) leaves objects in
    this interpreter (``sys.modules`` entries, types) that point into it; unmapping it would make
    the next walk over ``sys.modules`` crash the process."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    _unlock_cffi_embedding()
    with calling():
        p = lib.ggml_backend_load(str(path).encode())
    if p == ffi.NULL:
        raise GGMLError(f"ggml could not load a backend from {path} (see the pyggml.ggml log)")
    # one more reference, never dropped, with RTLD_NODELETE: ggml's dlclose cannot unmap it
    _pinned.append(ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_NOLOAD | os.RTLD_NODELETE))
    return Registry(p)


def unload_backend(reg: Registry) -> None:
    """``ggml_backend_unload``: unregister a loaded backend (the C functions pyggml bound to
    that library are unbound first). A library loaded by :func:`load_backend` stays mapped."""
    backend = dl.backend_of(reg.name)
    if backend:
        lib.pyggml_dl_unbind(backend.encode())
    with calling():
        lib.ggml_backend_unload(reg.ptr)
    reg.close()


def load_all(path: str | Path | None = None) -> None:
    """``ggml_backend_load_all_from_path``: load every backend module found in ``path``
    (default: pyggml's own library folder, never the executable's folder or the working dir)."""
    with calling():
        lib.ggml_backend_load_all_from_path(str(path or LIB_DIR).encode())


