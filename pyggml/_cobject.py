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
(:class:`pyggml.tensor.Tensor`: the context's *generation*, which ``reset()`` and ``close()``
change). Whatever C itself holds a handle to (Python backends, callbacks) is kept alive by the
object C reaches it through, until C lets go.

Some C objects point at each other (a device makes backends, a backend names its device; a
buffer type names its device). Their modules cannot all import each other, so a concept
module registers how to wrap its pointers (:func:`register_wrapper`) and the others ask for it by
name (:func:`wrap`): ``wrap("device", ptr)``. ``pyggml/__init__`` imports every concept module,
so every kind is registered before user code runs.
"""
from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any, Callable, Iterable, TypeVar

from .errors import ClosedError, GGMLError
from .raw import ffi
from .raw.boundary import lent

__all__ = ["CBorrowed", "CObject", "register_wrapper", "wrap", "using", "guarded", "holding"]

_Self = TypeVar("_Self", bound="CBorrowed")
_Fn = TypeVar("_Fn", bound=Callable[..., Any])


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
        # threads: C calls that use this object hold this lock (:class:`using`); close() takes
        # it too, so it waits for them. ``_closers``: closes and resets running (:class:`_closing`)
        self._lock = threading.RLock()
        self._closers = 0

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
        """Free the C object if owned (idempotent); any later use raises ClosedError."""
        with _closing(self):
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
                self.close()
        except Exception:  # noqa: BLE001 - nothing may escape __del__
            pass

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self._ptr is not None
                and self._ptr == other._ptr)

    def __hash__(self) -> int:
        # the pointer it was made with: the hash must not change when the object is closed
        return hash((type(self), getattr(self, "_key", self._ptr)))


#: counts closes and resets (and placers' new placements: :func:`changed`), at their start and
#: at their end (under the lock of what they change), so that a call that checked its objects
#: before taking their locks knows whether to check again under them
changes = 0


def changed() -> None:
    """Count a change that may invalidate another thread's check (see :data:`changes`)."""
    global changes
    changes += 1


class _closing:
    """``with _closing(obj):`` around a close or reset: waits (the object's lock) while another
    thread's C call uses ``obj``; RuntimeError, with nothing changed, when a call on this very
    thread uses it, or the call a callback on one of ggml's threads works for (a callback of
    that call closing it: C would go on with freed memory; :class:`~pyggml.raw.boundary.on_behalf`).

    A call that uses ``obj`` holds its lock (:class:`using`, op constructors): the lock already
    held by this thread, outside a close of ``obj`` (``_closers``: a close may reset), is one."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        lock = getattr(obj, "_lock", None)
        self.obj = None
        if lock is None:
            return
        if (lock._is_owned() or lock in lent()) and not obj._closers:
            raise RuntimeError(f"cannot close or reset this {obj._kind} from a callback of a "
                               "call that is using it (C would go on with freed memory)")
        lock.acquire()
        obj._closers += 1
        global changes
        changes += 1
        self.obj = obj

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        obj = self.obj
        if obj is not None:
            obj._closers -= 1
            # counted again at the end, still holding the lock: a thread that read ``changes``
            # while this ran (after the first count) and checked the object before the close
            # changed it sees a new count once it holds the lock, and checks again
            global changes
            changes += 1
            obj._lock.release()


def guarded(fn: _Fn) -> _Fn:
    """Decorator of the ``close`` and ``reset`` of CObject subclasses: they run as
    :class:`_closing` says (waiting for other threads' calls that use the object; RuntimeError
    from a callback of a call on this thread that uses it)."""
    @functools.wraps(fn)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _closing(self):
            return fn(self, *args, **kwargs)
    return guarded  # type: ignore[return-value]


def holding(fn: _Fn) -> _Fn:
    """Decorator of methods that call C with the object (a backend's ``name``, ``synchronize``...;
    a context's ``alloc_tensors``): they hold the object's lock, so that a close or reset on
    another thread waits for them instead of freeing the object under them."""
    @functools.wraps(fn)
    def holding(self: Any, *args: Any, **kwargs: Any) -> Any:
        lock = self._lock
        if not lock.acquire(False):
            if lock in lent():  # held for this callback by the call it works for
                return fn(self, *args, **kwargs)
            lock.acquire()
        try:
            return fn(self, *args, **kwargs)
        finally:
            lock.release()
    return holding  # type: ignore[return-value]


class using:
    """``with using(a, b, ...):`` around C calls that use the objects (CObjects or objects with a
    ``_lock``; None and others skipped): holds their locks, so that another thread's call on
    them waits, and so does their :meth:`~CObject.close`. The locks are taken all or none (a
    lock held elsewhere: release, wait for it, try again), so two calls never wait on each
    other; re-entrant on one thread (a callback may use them again), and a callback on one of
    ggml's threads neither waits for nor releases the locks its waiting caller holds for it
    (:class:`~pyggml.raw.boundary.on_behalf`)."""

    __slots__ = ("locks",)

    def __init__(self, *objs: Any):
        seen: dict[int, Any] = {}
        for o in objs:
            lock = getattr(o, "_lock", None) if o is not None else None
            if lock is not None:
                seen[id(lock)] = lock
        self.locks = tuple(seen.values())

    @classmethod
    def of(cls, locks: tuple[Any, ...]) -> "using":
        """A :class:`using` of the locks an earlier one found (``.locks``: distinct), made
        without looking again (computes cache them per checked graph)."""
        u = cls.__new__(cls)
        u.locks = locks
        return u

    @classmethod
    def arenas(cls, objs: Iterable[Any]) -> "using":
        """A :class:`using` of the arena locks (``Context._arena_lock``) of ``objs``, each once;
        objects without one (a borrow scope's is None) skipped."""
        seen: dict[int, Any] = {}
        for o in objs:
            lock = getattr(o, "_arena_lock", None)
            if lock is not None:
                seen[id(lock)] = lock
        return cls.of(tuple(seen.values()))

    def __enter__(self) -> None:
        locks = self.locks
        n = 0
        for lock in locks:  # the common case: none held elsewhere
            if not lock.acquire(False):
                break
            n += 1
        else:
            return
        for lock in locks[:n]:
            lock.release()
        wait = n
        held = lent()
        if held:  # a callback on ggml's thread: what its caller holds for it is not waited for
            locks = tuple(lock for lock in locks if lock not in held)
            if not locks:
                return
            wait = 0
        while True:
            locks[wait].acquire()
            got = [locks[wait]]
            for i, lock in enumerate(locks):
                if i == wait:
                    continue
                if lock.acquire(False):
                    got.append(lock)
                    continue
                for g in got:
                    g.release()
                wait = i
                break
            else:
                return

    def __exit__(self, *exc: object) -> None:
        for lock in self.locks:
            try:
                lock.release()
            except RuntimeError:  # not taken: lent to this callback by its caller (on_behalf)
                if lock not in lent():
                    raise


_WRAPPERS: dict[str, Callable[..., Any]] = {}


def register_wrapper(kind: str, make: Callable[..., Any]) -> None:
    """Declare how to wrap a C pointer of ``kind`` (``"device"``, ``"backend"``...): ``make(ptr,
    *args)``. Called once by the module that defines the concept."""
    _WRAPPERS[kind] = make


def wrap(kind: str, ptr: Any, *args: Any) -> Any:
    """The Python object for C pointer ``ptr`` of ``kind`` (see :func:`register_wrapper`)."""
    return _WRAPPERS[kind](ptr, *args)
