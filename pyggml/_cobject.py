"""The one lifetime scheme of the Pythonic layer.

Every Python object that holds a C pointer is a :class:`CObject`:

* **owned** (``owned=True``): it frees the C object in :meth:`~CObject.close` (also on ``with``
  exit and, as a last resort, when collected; never during interpreter shutdown, where it leaks
  rather than risk running C code against half-torn-down Python);
* **borrowed** (``owned=False``): the C object belongs to ``owner``, which this object keeps
  alive; :meth:`~CObject.close` only forgets the pointer;
* ``keep``: other objects C holds pointers into (a NumPy array under a buffer, the backends of a
  scheduler, a Python callback): kept alive exactly as long as this object;
* after :meth:`~CObject.close`, or once its owner is closed, :attr:`~CObject.ptr` raises
  :class:`~pyggml.errors.ClosedError` instead of handing out freed memory;
* NumPy views of an object's memory register with :meth:`~CObject._export`: while one lives,
  closing only marks the object closed, and the memory is freed with the last view.

Tensors are borrowed from their context with a cheaper check of their own
(:class:`pyggml.core.tensor.Tensor`: the context's *generation*, which ``reset()`` and ``close()``
change). Whatever C itself holds a handle to (Python backends, callbacks) is kept alive by the
object C reaches it through, until C lets go.
"""
from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Protocol, TypeVar

from .raw import threads
from .errors import ClosedError, GGMLError
from .raw import ffi

__all__ = ["CBorrowed", "CObject", "HasPtr"]

_Self = TypeVar("_Self", bound="CBorrowed")


class HasPtr(Protocol):
    """Anything with a C pointer (``ptr``): how modules below the tensor module name a
    :class:`~pyggml.core.tensor.Tensor` they take."""

    @property
    def ptr(self) -> Any: ...


class CBorrowed:
    """What every object holding a C pointer offers: :attr:`~CObject.ptr` (ClosedError once
    closed), :attr:`closed`, :meth:`close`, ``with``. No instance layout of its own, so that the
    most numerous borrowed objects (tensors) can keep just the slots they need."""

    __slots__ = ()

    @property
    def closed(self) -> bool:  # pragma: no cover - every subclass defines it
        raise TypeError("abstract")

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise TypeError("abstract")


class CObject(CBorrowed):
    """A Python object around one C object pointer (see the module docstring)."""

    __slots__ = ("_ptr", "_owner", "__weakref__", "__dict__")

    _c_free: Any = None  # the C function that frees an owned pointer, set by subclasses
    _kind = "object"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``close`` and ``reset`` run as :class:`pyggml.raw.threads.closing`
        says (they wait for other threads' calls; RuntimeError from a callback)."""
        super().__init_subclass__(**kwargs)
        for name in ("close", "reset"):
            fn = cls.__dict__.get(name)
            if fn is not None and not getattr(fn, "_closes", False):
                setattr(cls, name, threads.closes(fn))

    def __init__(self, ptr: Any, *, owned: bool, owner: Any = None, keep: Any = None):
        if ptr is None or ptr == ffi.NULL:
            raise GGMLError(f"ggml returned NULL for a {self._kind}")
        self._ptr = ptr
        self._key = ptr
        self._owner = owner
        self._owned = owned
        self._keep = keep
        self._views = 0  # live NumPy views of this object's memory
        self._pending_free: Any = None
        self._lock = threading.RLock()  # calls that use the object take turns (pyggml.raw.threads)

    def _export(self, holder: Any) -> None:
        """Register ``holder``, the object behind a NumPy view of this object's memory: while one
        lives, :meth:`close` only marks the object closed and the memory is freed once the last
        view is gone."""
        self._views += 1
        weakref.finalize(holder, self._view_gone)

    def _view_gone(self) -> None:
        self._views -= 1
        if self._views == 0 and self._pending_free is not None:
            ptr, self._pending_free = self._pending_free, None
            if not sys.is_finalizing():
                self._free(ptr)

    @property
    def owned(self) -> bool:
        """Whether :meth:`close` frees the C object (else it belongs to another object)."""
        return self._owned

    @property
    def closed(self) -> bool:
        """True once closed, or once the object it is borrowed from is closed."""
        if self._ptr is None:
            return True
        owner = self._owner
        return owner is not None and owner.closed

    def _live_ptr(self) -> Any:
        """The C pointer (cffi cdata). Raises :class:`~pyggml.errors.ClosedError` once closed."""
        p, owner = self._ptr, self._owner
        if p is None or (owner is not None and owner.closed):
            raise ClosedError(f"this {self._kind} is closed")
        return p

    #: The C pointer (cffi cdata), for raw calls. Raises ClosedError once closed. (pyggml's own
    #: calls use ``_live_ptr()``: a subclass's ``ptr`` may record that raw code has the pointer.)
    ptr = property(_live_ptr)

    def _free(self, ptr: Any) -> None:
        type(self)._c_free(ptr)

    def close(self) -> None:
        """Free the C object if owned (idempotent); any later use raises ClosedError. Waits
        for other threads' calls; RuntimeError from a callback (:mod:`pyggml.raw.threads`)."""
        with threads.closing():
            self._close()

    def _close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is None or not self._owned:
            return
        owner = self._owner
        if owner is not None and getattr(owner, "closed", False):
            return  # freed with its owner
        if self._views:  # NumPy views still point into the memory: free it with the last one
            self._pending_free = ptr
        else:
            self._free(ptr)

    def __del__(self) -> None:
        # at interpreter exit module globals may already be gone: then leak, never crash
        if sys is None or sys.is_finalizing():
            return
        try:
            if getattr(self, "_ptr", None) is not None and getattr(self, "_owned", False):
                threads.close_later(self)
        except Exception:  # noqa: BLE001 - nothing may escape __del__
            pass

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self._ptr is not None
                and self._ptr == other._ptr)

    def __hash__(self) -> int:
        # the pointer it was made with: the hash must not change when the object is closed
        return hash((type(self), getattr(self, "_key", self._ptr)))
