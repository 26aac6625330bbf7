"""ggml devices (``ggml_backend_dev_t``): a device of a backend registry, which makes backends
(streams of work), buffer types and, where it can, buffers over host memory.

Devices belong to ggml's global registry: :class:`Device` borrows them and never frees them. The
lookups here (:func:`devices`, :func:`device_by_name`, :func:`device_by_type`) never fall back
silently: a device the build lacks raises :class:`~pyggml.errors.BackendNotAvailableError` with
the reason (:mod:`pyggml.raw.dl`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import _cobject
from ..memory import buffer
from .backend import Backend
from .blas import BLASBackend
from .cpu import CPUBackend
from . import extra_bufts
from ..memory.buffer import Buffer
from ..memory.buffer_type import BufferType
from ..enums import DeviceType, member
from ..types import TypeLike, ggml_type
from ..errors import BackendNotAvailableError, GGMLError
from ..raw import dl, ffi, lib
from ..raw.boundary import calling
from ..core.tensor import Tensor, tensor_arg

__all__ = ["Device", "DeviceProps", "devices", "device_by_name", "device_by_type", "init_by_name",
           "init_by_type", "init_best"]


def _str(p: Any) -> str:
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


@dataclass(frozen=True)
class DeviceProps:
    """``struct ggml_backend_dev_props``; memory in bytes."""
    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None
    async_: bool
    host_buffer: bool
    buffer_from_host_ptr: bool
    events: bool


class Device(_cobject.CObject):
    """A device, borrowed from ggml's registry."""

    _kind = "device"

    def __init__(self, ptr: Any):
        super().__init__(ptr, owned=False)

    @classmethod
    def of(cls, obj: Backend | BufferType) -> "Device":
        """The device of a backend (``ggml_backend_get_device``) or of a buffer type
        (``ggml_backend_buft_get_device``). Raises ValueError for one without a device (ggml's
        CPU buffer type), ClosedError for a closed one, TypeError for anything else."""
        with calling():
            if isinstance(obj, Backend):
                p = lib.ggml_backend_get_device(obj.ptr)
            elif isinstance(obj, BufferType):
                p = lib.ggml_backend_buft_get_device(obj.ptr)
            else:
                raise TypeError(f"Device.of takes a Backend or a BufferType, not {type(obj).__name__}")
        if p == ffi.NULL:
            raise ValueError(f"{obj._kind} {obj.name} belongs to no device")
        return cls(p)

    @property
    def name(self) -> str:
        """``ggml_backend_dev_name`` (``"CPU"``, ``"CUDA0"``, ``"Vulkan0"``...)."""
        with calling():
            return _str(lib.ggml_backend_dev_name(self.ptr))

    @property
    def description(self) -> str:
        """``ggml_backend_dev_description``."""
        with calling():
            return _str(lib.ggml_backend_dev_description(self.ptr))

    @property
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes (``ggml_backend_dev_memory``)."""
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        with calling():
            lib.ggml_backend_dev_memory(self.ptr, free, total)
        return int(free[0]), int(total[0])

    @property
    def type(self) -> DeviceType:
        """:class:`~pyggml.enums.DeviceType` (``ggml_backend_dev_type``)."""
        with calling():
            return DeviceType(lib.ggml_backend_dev_type(self.ptr))

    @property
    def props(self) -> DeviceProps:
        """``ggml_backend_dev_get_props``."""
        p = ffi.new("struct ggml_backend_dev_props *")
        with calling():
            lib.ggml_backend_dev_get_props(self.ptr, p)
        return DeviceProps(_str(p.name), _str(p.description), int(p.memory_free), int(p.memory_total),
                           DeviceType(p.type), _str(p.device_id) or None, bool(getattr(p.caps, "async")),
                           bool(p.caps.host_buffer), bool(p.caps.buffer_from_host_ptr), bool(p.caps.events))

    def init(self, params: str | None = None) -> Backend:
        """A new backend on this device (``ggml_backend_dev_init``); a
        :class:`~pyggml.backends.cpu.CPUBackend` for ggml's CPU device. GGMLError on failure (or what a
        Python device's ``init_backend`` raised)."""
        with calling():
            ptr = lib.ggml_backend_dev_init(self.ptr, params.encode() if params else ffi.NULL)
            if ptr == ffi.NULL:
                raise GGMLError(f"device {self.name} could not initialise a backend")
        return _backend(ptr)

    @property
    def buffer_type(self) -> BufferType:
        """The device's default buffer type (``ggml_backend_dev_buffer_type``)."""
        with calling():
            return BufferType(lib.ggml_backend_dev_buffer_type(self.ptr))

    @property
    def host_buffer_type(self) -> BufferType | None:
        """Pinned host memory for fast transfers (``ggml_backend_dev_host_buffer_type``), or None."""
        with calling():
            p = lib.ggml_backend_dev_host_buffer_type(self.ptr)
        return None if p == ffi.NULL else BufferType(p)

    @property
    def extra_buffer_types(self) -> list[BufferType]:
        """The device's extra buffer types that passed their trial on this machine, in ggml's
        order (``ggml_backend_dev_get_extra_bufts``, through the registry's proc address): the
        memory in which it keeps weights re-laid for its fastest products (``CPU_REPACK``,
        ``AMX``...; [] for most devices). The trial (:mod:`pyggml.backends.extra_bufts`) runs
        in a forked process on first use, once per process; :attr:`extra_buffer_type_trials`
        says what it found, types dropped included."""
        return extra_bufts.usable(self.ptr)

    @property
    def extra_buffer_type_trials(self) -> list[extra_bufts.Trial]:
        """Every extra buffer type ggml lists for this device with its trial's verdict: the
        weight types the device's products take in it, and ``error``, why it is not used
        (None: it is)."""
        return extra_bufts.trials(self.ptr)

    def weight_buffer_type(self, type: TypeLike, ne: Sequence[int], *, extra: bool = True) -> BufferType:
        """Where llama.cpp's rule puts a weight of ``type`` and ``ne`` (ggml order) that a
        matrix product by float32 activations reads (``MUL_MAT``, the weight as source 0): the
        first of :attr:`extra_buffer_types` for which the device's ``supports_op`` takes that
        product, else :attr:`buffer_type` (always, with ``extra=False``). Weights read by other
        ops (``GET_ROWS`` of an embedding table, a view) belong in :attr:`buffer_type`: ggml's
        kernels read only products from an extra buffer type. Raises ValueError for an unknown
        type or an ``ne`` of other than 1 to 4 sizes >= 0."""
        t = ggml_type(type)
        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= 4 or min(ne) < 0:
            raise ValueError(f"ne must be 1 to 4 sizes >= 0, not {ne}")
        if not extra or len(ne) != 2 or ne[0] % int(lib.ggml_blck_size(t)):
            return self.buffer_type
        return extra_bufts.weight_buffer_type(self.ptr, self.buffer_type, t, ne)

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
        with calling(), buffer.lifecycle:
            ptr = lib.ggml_backend_dev_buffer_from_host_ptr(self.ptr, ffi.from_buffer(array), size,
                                                            max_tensor_size or size)
            if ptr == ffi.NULL:
                raise GGMLError(f"device {self.name} could not make a buffer of {size} bytes")
            return Buffer(ptr, owned=True, keep=array)

    def supports_op(self, op: Tensor) -> bool:
        """``ggml_backend_dev_supports_op``."""
        p = tensor_arg(op, "op")._ptr
        with calling():
            return bool(lib.ggml_backend_dev_supports_op(self.ptr, p))

    def supports_buft(self, buft: BufferType) -> bool:
        """``ggml_backend_dev_supports_buft``."""
        with calling():
            return bool(lib.ggml_backend_dev_supports_buft(self.ptr, buft.ptr))

    def offload_op(self, op: Tensor) -> bool:
        """``ggml_backend_dev_offload_op``."""
        p = tensor_arg(op, "op")._ptr
        with calling():
            return bool(lib.ggml_backend_dev_offload_op(self.ptr, p))

    def __repr__(self) -> str:
        return f"<Device {self.name} ({self.type.name.lower()}): {self.description}>"


def devices() -> list[Device]:
    """Every registered device (``ggml_backend_dev_count/get``)."""
    return [Device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def device_by_name(name: str) -> Device:
    """``ggml_backend_dev_by_name`` (case-insensitive). Raises
    :class:`~pyggml.errors.BackendNotAvailableError` (a KeyError) naming the devices there are
    and why the one asked for is missing (not built, or built but not loaded)."""
    with calling():
        p = lib.ggml_backend_dev_by_name(name.encode())
    if p == ffi.NULL:
        raise BackendNotAvailableError(
            f"no ggml device named {name!r} (devices: {', '.join(d.name for d in devices())}): "
            f"{dl.explain(name)}")
    return Device(p)


def device_by_type(type: DeviceType | str | int) -> Device:
    """``ggml_backend_dev_by_type``: the first device of ``type`` (a
    :class:`~pyggml.enums.DeviceType` or its name, ``"gpu"``...). Raises
    :class:`~pyggml.errors.BackendNotAvailableError` (a KeyError) if there is none, listing the
    built backends that did not load; ValueError for an unknown type."""
    t = member(DeviceType, type)
    with calling():
        p = lib.ggml_backend_dev_by_type(t)
    if p == ffi.NULL:
        failed = [f"{s.name}: {s.error}" for s in dl.status().values() if not s.loaded]
        raise BackendNotAvailableError(
            f"no ggml device of type {t.name.lower()!r} (devices: "
            f"{', '.join(f'{d.name} ({d.type.name.lower()})' for d in devices())}; built backends: "
            f"{', '.join(dl.built_backends())}"
            + (f"; not loaded: {'; '.join(failed)}" if failed else "") + ")")
    return Device(p)



def init_by_name(name: str, params: str | None = None) -> Backend:
    """``ggml_backend_init_by_name``: a backend on the device called ``name``. Raises
    :class:`~pyggml.errors.BackendNotAvailableError` (a KeyError) saying why there is none."""
    return device_by_name(name).init(params)


def init_by_type(type: DeviceType | str | int, params: str | None = None) -> Backend:
    """``ggml_backend_init_by_type``: a backend on the first device of ``type`` (a
    :class:`~pyggml.enums.DeviceType` or its name); BackendNotAvailableError if none."""
    return device_by_type(type).init(params)


def init_best() -> Backend:
    """``ggml_backend_init_best``: the first GPU, else integrated GPU, else the CPU."""
    with calling():
        ptr = lib.ggml_backend_init_best()
    if ptr == ffi.NULL:
        raise GGMLError("no backend could be initialised")
    return _backend(ptr)


def _backend(ptr: Any) -> Backend:
    """An owned Backend for ``ptr``: a CPUBackend when it is ggml's CPU backend, a BLASBackend
    when it is ggml-blas."""
    if dl.is_bound("ggml_backend_is_cpu") and lib.ggml_backend_is_cpu(ptr):
        return CPUBackend._wrap(ptr)
    if hasattr(lib, "ggml_backend_is_blas") and dl.is_bound("ggml_backend_is_blas") and getattr(lib, "ggml_backend_is_blas")(ptr):
        return BLASBackend._wrap(ptr)
    return Backend(ptr)
