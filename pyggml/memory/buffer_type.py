"""Buffer types (``ggml_backend_buffer_type_t``, "buft"): how and where a device allocates memory.

A buffer type belongs to its device (or library) and is never freed: :class:`BufferType` borrows
it. A buffer type implemented in Python (:class:`pyggml.impl.PyBufferType`) is kept alive by the
:class:`BufferType` objects made from it.
"""
from __future__ import annotations

from typing import Any

from .. import _cobject
from . import buffer
from .buffer import Buffer
from ..raw import ffi, lib
from ..raw.boundary import calling

__all__ = ["BufferType"]


def _str(p: Any) -> str:
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


class BufferType(_cobject.CObject):
    """A buffer type, borrowed: it lives as long as its device/library (ggml never frees one).
    ``keep`` (optional) is kept alive with it, e.g. the Python buffer type behind its C struct."""

    _kind = "buffer type"

    def __init__(self, ptr: Any, keep: Any = None):
        super().__init__(ptr, owned=False, keep=keep)

    @classmethod
    def of(cls, buffer: Buffer) -> "BufferType":
        """The type of ``buffer`` (``ggml_backend_buffer_get_type``). Raises TypeError for
        anything but a :class:`~pyggml.memory.buffer.Buffer`, ClosedError for a closed one."""
        if not isinstance(buffer, Buffer):
            raise TypeError(f"BufferType.of takes a Buffer, not {type(buffer).__name__}")
        with calling():
            return cls(lib.ggml_backend_buffer_get_type(buffer.ptr), buffer)

    @property
    def name(self) -> str:
        """``ggml_backend_buft_name``."""
        with calling():
            return _str(lib.ggml_backend_buft_name(self.ptr))

    @property
    def alignment(self) -> int:
        """Byte alignment of allocations (``ggml_backend_buft_get_alignment``)."""
        with calling():
            return int(lib.ggml_backend_buft_get_alignment(self.ptr))

    @property
    def max_size(self) -> int:
        """Largest single buffer in bytes (``ggml_backend_buft_get_max_size``)."""
        with calling():
            return int(lib.ggml_backend_buft_get_max_size(self.ptr))

    @property
    def is_host(self) -> bool:
        """Whether buffers of this type are in host memory (``ggml_backend_buft_is_host``)."""
        with calling():
            return bool(lib.ggml_backend_buft_is_host(self.ptr))

    def alloc_size(self, tensor: _cobject.HasPtr) -> int:
        """Bytes ``tensor`` (a :class:`~pyggml.core.tensor.Tensor`) needs in this buffer type
        (``ggml_backend_buft_get_alloc_size``)."""
        with calling():
            return int(lib.ggml_backend_buft_get_alloc_size(self.ptr, tensor.ptr))

    def alloc_buffer(self, size: int) -> Buffer:
        """``ggml_backend_buft_alloc_buffer``: a new owned buffer of ``size`` bytes.
        Raises ValueError for a negative size or one above :attr:`max_size`, MemoryError if the
        allocation fails (or what a Python buffer type's ``alloc_buffer`` raised)."""
        if size < 0 or size > self.max_size:
            raise ValueError(f"buffer size {size} is outside 0..{self.max_size}")
        with calling(), buffer.lifecycle:
            ptr = lib.ggml_backend_buft_alloc_buffer(self.ptr, size)
            if ptr == ffi.NULL:
                raise MemoryError(f"{self.name}: could not allocate {size} bytes")
            return Buffer(ptr, owned=True, keep=self)

    def __repr__(self) -> str:
        return "<BufferType (closed)>" if self.closed else f"<BufferType {self.name}>"

