"""Shared machinery of the Pythonic layer: errors and ownership of C objects."""
from __future__ import annotations

import sys
import weakref
from typing import Any

from ._loader import ffi

__all__ = ["GGMLError", "ClosedError", "CObject"]


class GGMLError(RuntimeError):
    """ggml reported a failure (a NULL result, a failed status)."""


class ClosedError(ValueError):
    """The C object was freed (``close()``) and may not be used any more."""


class CObject:
    """A Python object around one C object pointer.

    ``owned=True``: this object frees the C object in :meth:`close` (also on ``with`` exit and,
    as a last resort, when collected). ``owned=False``: it is borrowed from ``owner``, which this
    object keeps alive; :meth:`close` only forgets the pointer. After :meth:`close`, :attr:`ptr`
    raises :class:`ClosedError` instead of handing out freed memory.
    """

    _c_free: Any = None  # the C function that frees an owned pointer, set by subclasses
    _kind = "object"

    def __init__(self, ptr: Any, *, owned: bool, owner: Any = None):
        if ptr == ffi.NULL:
            raise GGMLError(f"ggml returned NULL for a {self._kind}")
        self._ptr = ptr
        self._owned = owned
        self._owner = owner
        self._exports: "weakref.WeakSet[Any] | None" = None
        self._pending_free: Any = None

    def _export(self, holder: Any) -> None:
        """Register a NumPy view of this object's memory: while one lives, :meth:`close` only
        marks the object closed and the memory is freed once the last view is gone."""
        if self._exports is None:
            self._exports = weakref.WeakSet()
        self._exports.add(holder)

    @property
    def owned(self) -> bool:
        """Whether :meth:`close` frees the C object (else it belongs to another object)."""
        return self._owned

    @property
    def closed(self) -> bool:
        if self._ptr is None:
            return True
        owner = self._owner
        return owner is not None and owner.closed

    @property
    def ptr(self) -> Any:
        """The C pointer (cffi cdata). Raises :class:`ClosedError` once closed."""
        p, owner = self._ptr, self._owner
        if p is None or (owner is not None and owner.closed):
            raise ClosedError(f"this {self._kind} is closed")
        return p

    def _free(self, ptr: Any) -> None:
        type(self)._c_free(ptr)

    def close(self) -> None:
        """Free the C object if owned (idempotent); any later use raises :class:`ClosedError`."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None and self._owned and not (self._owner is not None and getattr(self._owner, "closed", False)):
            if self._exports:  # NumPy views still point into the memory: free it with the last one
                self._pending_free = ptr
            else:
                self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # at interpreter exit module globals may already be gone: then leak, never crash
        if sys is None or sys.is_finalizing():
            return
        try:
            if getattr(self, "_pending_free", None) is not None:
                self._exports = None
                self._free(self._pending_free)
                self._pending_free = None
            elif getattr(self, "_ptr", None) is not None:
                self._exports = None
                self.close()
        except Exception:
            pass

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._ptr is not None and self._ptr == other._ptr  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), int(ffi.cast("uintptr_t", self._ptr)) if self._ptr is not None else 0))
