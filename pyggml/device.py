"""ggml devices and backend registries (``ggml_backend_dev_t``, ``ggml_backend_reg_t``).

Devices and registries belong to ggml's global registry: the Python objects borrow them and are
never freed. Registries loaded from a library (:func:`load_backend`) are removed with
:func:`unload_backend`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import callbacks, dl
from ._base import CObject, GGMLError
from ._loader import LIB_DIR, ffi, lib
from .backend import Backend, Buffer, BufferType, _str
from .tensor import Tensor

__all__ = ["Device", "DeviceProps", "Registry", "DEVICE_TYPES", "registries", "devices",
           "device_by_name", "device_by_type", "registry_by_name", "load_backend",
           "unload_backend", "load_all"]

#: ``enum ggml_backend_dev_type`` by name
DEVICE_TYPES = {"cpu": lib.GGML_BACKEND_DEVICE_TYPE_CPU, "gpu": lib.GGML_BACKEND_DEVICE_TYPE_GPU,
                "igpu": lib.GGML_BACKEND_DEVICE_TYPE_IGPU, "accel": lib.GGML_BACKEND_DEVICE_TYPE_ACCEL}
if hasattr(lib, "GGML_BACKEND_DEVICE_TYPE_META"):
    DEVICE_TYPES["meta"] = lib.GGML_BACKEND_DEVICE_TYPE_META


def _type_name(t: int) -> str:
    return next((k for k, v in DEVICE_TYPES.items() if v == t), str(t))


@dataclass(frozen=True)
class DeviceProps:
    """``struct ggml_backend_dev_props``; memory in bytes."""
    name: str
    description: str
    memory_free: int
    memory_total: int
    type: str
    device_id: str | None
    async_: bool
    host_buffer: bool
    buffer_from_host_ptr: bool
    events: bool


class Device(CObject):
    """A device (borrowed from ggml's registry)."""

    _kind = "device"

    def __init__(self, ptr: Any):
        super().__init__(ptr, owned=False)

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_dev_name(self.ptr))

    @property
    def description(self) -> str:
        return _str(lib.ggml_backend_dev_description(self.ptr))

    @property
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes (``ggml_backend_dev_memory``)."""
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        lib.ggml_backend_dev_memory(self.ptr, free, total)
        return free[0], total[0]

    @property
    def type(self) -> str:
        """``"cpu"``, ``"gpu"``, ``"igpu"`` or ``"accel"`` (``ggml_backend_dev_type``)."""
        return _type_name(lib.ggml_backend_dev_type(self.ptr))

    @property
    def props(self) -> DeviceProps:
        """``ggml_backend_dev_get_props``."""
        p = ffi.new("struct ggml_backend_dev_props *")
        lib.ggml_backend_dev_get_props(self.ptr, p)
        return DeviceProps(_str(p.name), _str(p.description), p.memory_free, p.memory_total,
                           _type_name(p.type), _str(p.device_id) or None, bool(getattr(p.caps, "async")),
                           bool(p.caps.host_buffer), bool(p.caps.buffer_from_host_ptr), bool(p.caps.events))

    @property
    def registry(self) -> "Registry":
        return Registry(lib.ggml_backend_dev_backend_reg(self.ptr))

    def init(self, params: str | None = None) -> Backend:
        """A new backend on this device (``ggml_backend_dev_init``); GGMLError on failure."""
        from .cpu import CPUBackend

        ptr = lib.ggml_backend_dev_init(self.ptr, params.encode() if params else ffi.NULL)
        callbacks.raise_pending()  # a Python device's init_backend may have raised
        if ptr == ffi.NULL:
            raise GGMLError(f"device {self.name} could not initialise a backend")
        return CPUBackend._wrap(ptr) if lib.ggml_backend_is_cpu(ptr) else Backend(ptr)

    @property
    def buffer_type(self) -> BufferType:
        return BufferType(lib.ggml_backend_dev_buffer_type(self.ptr))

    @property
    def host_buffer_type(self) -> BufferType | None:
        """Pinned host memory for fast transfers (``ggml_backend_dev_host_buffer_type``), or None."""
        p = lib.ggml_backend_dev_host_buffer_type(self.ptr)
        return None if p == ffi.NULL else BufferType(p)

    def buffer_from_host_ptr(self, array: np.ndarray, max_tensor_size: int | None = None) -> Buffer:
        """A buffer over ``array``'s memory, no copy (``ggml_backend_dev_buffer_from_host_ptr``).

        ``array`` must be C-contiguous and writable; the buffer keeps it alive. Raises
        ValueError if the device cannot do this (``caps.buffer_from_host_ptr``).
        """
        if not self.props.buffer_from_host_ptr:
            raise ValueError(f"device {self.name} cannot make buffers from host pointers")
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise ValueError("the array must be writable and C-contiguous")
        size = array.nbytes
        ptr = lib.ggml_backend_dev_buffer_from_host_ptr(self.ptr, ffi.from_buffer(array), size,
                                                        max_tensor_size or size)
        return Buffer(ptr, owned=True, keep=array)

    def supports_op(self, op: Tensor) -> bool:
        return bool(lib.ggml_backend_dev_supports_op(self.ptr, op.ptr))

    def supports_buft(self, buft: BufferType) -> bool:
        return bool(lib.ggml_backend_dev_supports_buft(self.ptr, buft.ptr))

    def offload_op(self, op: Tensor) -> bool:
        return bool(lib.ggml_backend_dev_offload_op(self.ptr, op.ptr))

    def __repr__(self) -> str:
        return f"<Device {self.name} ({self.type}): {self.description}>"


class Registry(CObject):
    """A backend registry (``ggml_backend_reg_t``): one backend library and its devices."""

    _kind = "registry"

    def __init__(self, ptr: Any):
        super().__init__(ptr, owned=False)

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_reg_name(self.ptr))

    @property
    def devices(self) -> list[Device]:
        r = self.ptr
        return [Device(lib.ggml_backend_reg_dev_get(r, i)) for i in range(lib.ggml_backend_reg_dev_count(r))]

    def get_proc_address(self, name: str, ctype: str | None = None) -> Any:
        """``ggml_backend_reg_get_proc_address``: the backend-specific function ``name`` cast to
        ``ctype`` (e.g. ``"ggml_backend_set_n_threads_t"``), or None if it does not exist."""
        p = lib.ggml_backend_reg_get_proc_address(self.ptr, name.encode())
        if p == ffi.NULL:
            return None
        return ffi.cast(ctype, p) if ctype else p

    def __repr__(self) -> str:
        return f"<Registry {self.name}: {len(self.devices)} device(s)>"


def registries() -> list[Registry]:
    """Every registered backend registry (``ggml_backend_reg_count/get``)."""
    return [Registry(lib.ggml_backend_reg_get(i)) for i in range(lib.ggml_backend_reg_count())]


def devices() -> list[Device]:
    """Every registered device (``ggml_backend_dev_count/get``)."""
    return [Device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def device_by_name(name: str) -> Device:
    """``ggml_backend_dev_by_name`` (case-insensitive). Raises
    :class:`~pyggml.dl.BackendNotAvailableError` (a KeyError) naming the devices there are and
    why the one asked for is missing (not built, or built but not loaded)."""
    p = lib.ggml_backend_dev_by_name(name.encode())
    if p == ffi.NULL:
        raise dl.BackendNotAvailableError(
            f"no ggml device named {name!r} (devices: {', '.join(d.name for d in devices())}): "
            f"{dl.explain(name)}")
    return Device(p)


def device_by_type(type: str | int) -> Device:
    """``ggml_backend_dev_by_type``: the first device of ``type`` (``"cpu"``, ``"gpu"``...).
    Raises :class:`~pyggml.dl.BackendNotAvailableError` (a KeyError) if there is none, listing
    the built backends that did not load."""
    t = DEVICE_TYPES[type] if isinstance(type, str) else type
    p = lib.ggml_backend_dev_by_type(t)
    if p == ffi.NULL:
        failed = [f"{s.name}: {s.error}" for s in dl.status().values() if not s.loaded]
        raise dl.BackendNotAvailableError(
            f"no ggml device of type {type!r} (devices: "
            f"{', '.join(f'{d.name} ({d.type})' for d in devices())}; built backends: "
            f"{', '.join(dl.built_backends())}"
            + (f"; not loaded: {'; '.join(failed)}" if failed else "") + ")")
    return Device(p)


def registry_by_name(name: str) -> Registry:
    """``ggml_backend_reg_by_name``. Raises :class:`~pyggml.dl.BackendNotAvailableError`
    (a KeyError) saying why the registry is missing."""
    p = lib.ggml_backend_reg_by_name(name.encode())
    if p == ffi.NULL:
        raise dl.BackendNotAvailableError(
            f"no ggml backend registry named {name!r} (registries: "
            f"{', '.join(r.name for r in registries())}): {dl.explain(name)}")
    return Registry(p)


def _unlock_cffi_embedding() -> None:
    """Let a cffi-embedding module (e.g. from ``python -m pyggml.module``) start in this process.

    On Python < 3.12 cffi's embedding start-up spins until ``PyCapsule_Type.tp_version_tag`` is
    0 (it uses it as a lock), but any attribute lookup on a capsule object gives the type a
    version tag: the load would hang forever. ``PyType_Modified`` resets the tag (it only
    invalidates the method cache entries of the capsule type)."""
    if sys.version_info < (3, 12):
        import ctypes
        import datetime

        ctypes.pythonapi.PyType_Modified(ctypes.py_object(type(datetime.datetime_CAPI)))


def load_backend(path: str | Path) -> Registry:
    """``ggml_backend_load``: load a backend module (a shared library exporting
    ``ggml_backend_init``) and register it. Raises FileNotFoundError or GGMLError.

    The library is marked ``RTLD_NODELETE``: :func:`unload_backend` unregisters it, but its code
    stays mapped. A module implemented in Python (``python -m pyggml.module``) leaves objects in
    this interpreter (``sys.modules`` entries, types) that point into it; unmapping it would make
    the next walk over ``sys.modules`` crash the process."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    _unlock_cffi_embedding()
    p = lib.ggml_backend_load(str(path).encode())
    if p == ffi.NULL:
        raise GGMLError(f"ggml could not load a backend from {path} (see the pyggml.ggml log)")
    import ctypes
    import os

    # one more reference, never dropped, with RTLD_NODELETE: ggml's dlclose cannot unmap it
    _pinned.append(ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_NOLOAD | os.RTLD_NODELETE))
    return Registry(p)


_pinned: list[Any] = []


def unload_backend(reg: Registry) -> None:
    """``ggml_backend_unload``: unregister a loaded backend (the C functions pyggml bound to
    that library are unbound first). A library loaded by :func:`load_backend` stays mapped."""
    backend = dl._backend_of(reg.name)
    if backend:
        lib.pyggml_dl_unbind(backend.encode())
    lib.ggml_backend_unload(reg.ptr)
    reg.close()


def load_all(path: str | Path | None = None) -> None:
    """``ggml_backend_load_all_from_path``: load every backend module found in ``path``
    (default: pyggml's own library folder, never the executable's folder or the working dir)."""
    lib.ggml_backend_load_all_from_path(str(path or LIB_DIR).encode())
