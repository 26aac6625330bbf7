"""pyggml's one concurrency contract, and its only implementation.

**The rule.** pyggml objects may be shared by threads (cffi lets go of the GIL in every C call,
so two threads can be inside ggml at once, and ggml's objects are not thread-safe):

* calls that use the same object take turns; calls on different objects run in parallel;
* ``close()`` and ``reset()`` wait until no other thread is inside a pyggml call, so nothing
  they free or forget is in use; called from inside a call on the same thread (a callback),
  they raise RuntimeError and change nothing.

**How.** One process-wide *gate*: a call holds it shared (every C call that may call back into
Python runs inside :class:`pyggml.raw.boundary.calling`, which enters it; :class:`using`
enters it too), a close or reset exclusively (:class:`closing`). An object that calls must not interleave on has a
lock (``_lock``), taken by the calls that use it, all of them at once or none (so two calls never
wait on each other). A context's lock is special: op constructors, the hot path, take only it
(not the gate), so a close or reset also takes the lock of every context.

A callback that ggml runs on one of its own threads (a custom op on a CPU worker thread) works
for a call whose thread waits for it: it runs :class:`on_behalf` of that call, which lends it
the gate and the locks the call holds. :data:`changes` counts closes, resets and placements, so
that a check made before taking the locks knows whether to look again under them.

A ``__del__`` never waits: an object collected while its close would have to wait (another
thread's call, or a call on this thread) is closed by the next close, or at the end of the next
call that leaves no call open on its thread and finds the gate free.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Iterable, TypeVar

__all__ = ["using", "Held", "enter", "leave", "closing", "closes", "on_behalf", "declare", "undeclare",
           "owner_frame", "changes", "changed", "register_context", "live_contexts", "close_later"]

_Fn = TypeVar("_Fn", bound=Callable[..., Any])
_ident = threading.get_ident

#: thread idents inside a call, one entry per open call (a list: append/remove are atomic)
_readers: list[int] = []
#: the thread in a close or reset, or waiting to start one (new calls of other threads wait)
_writer: int | None = None
_depth = 0                         # nested closes of the writer thread
_writers = threading.Lock()       # one close or reset at a time
_cond = threading.Condition(threading.Lock())
_contexts: list["weakref.ref[Any]"] = []  # every context: closes take their locks
_contexts_lock = threading.RLock()  # re-entrant: a finalizer may run while it is held
_deferred: list[Any] = []          # objects collected while their close would have waited


class _Local(threading.local):
    def __init__(self) -> None:
        #: the locks (and the gate) a waiting caller lends this thread's callback (on_behalf)
        self.lent: tuple[Any, ...] | None = None


_local = _Local()

#: counts closes, resets and placements (at their start and end): a check made while it did not
#: move holds
changes = 0


def changed() -> None:
    """Count a change that may invalidate another thread's check (see :data:`changes`)."""
    global changes
    changes += 1


def register_context(ctx: Any) -> None:
    """Let closes and resets take ``ctx``'s lock (op constructors take only that one)."""
    ref = weakref.ref(ctx)  # made outside the lock: a finalizer it runs may take the lock
    with _contexts_lock:
        _contexts.append(ref)


def _context_locks() -> tuple[Any, ...]:
    with _contexts_lock:
        live = [c for c in (r() for r in _contexts) if c is not None]
        if len(live) < len(_contexts):
            _contexts[:] = [weakref.ref(c) for c in live]
    return _locks_of(live)


# ---------------------------------------------------------------------------- the gate
def _enter_gate() -> int:
    ident = _ident()
    _readers.append(ident)
    w = _writer
    if w is not None and w != ident:
        _wait_gate(ident)
    return ident


def _wait_gate(ident: int) -> None:
    """A close waits or runs on another thread: go on if this thread is inside a call already
    (the close waits for it) or works for one, else wait for the close to end."""
    if _readers.count(ident) > 1 or _local.lent is not None:
        return
    if any(lock._is_owned() for lock in _context_locks()):  # an op constructor's, or a walk's:
        return                                               # the close waits for it anyway
    while True:
        _readers.remove(ident)
        with _cond:
            _cond.notify_all()
            while _writer is not None and _writer != ident:
                _cond.wait(0.05)
        _readers.append(ident)
        if _writer is None or _writer == ident:
            return


def _leave_gate(ident: int) -> None:
    _readers.remove(ident)
    if _writer is not None:
        with _cond:
            _cond.notify_all()
    elif _deferred and ident not in _readers:
        _close_deferred()


#: enter the gate shared (a call: :class:`pyggml.raw.boundary.calling` does); returns the token
#: :func:`leave` takes
enter = _enter_gate
#: leave the gate (:func:`enter`)
leave = _leave_gate


def _inside_call(ident: int) -> bool:
    return ident in _readers or _local.lent is not None


# ---------------------------------------------------------------------------- object locks
def _locks_of(objs: Iterable[Any]) -> tuple[Any, ...]:
    seen: dict[int, Any] = {}
    for o in objs:
        lock = getattr(o, "_lock", None) if o is not None else None
        if lock is not None:
            seen[id(lock)] = lock
    return tuple(seen.values())


def _take(locks: tuple[Any, ...]) -> None:
    """Take ``locks`` all or none: a lock held elsewhere is waited for holding none. Locks lent
    to this thread's callback (:class:`on_behalf`) are neither waited for nor taken."""
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
    held = _local.lent
    if held:
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


def _give_back(locks: tuple[Any, ...]) -> None:
    held = _local.lent
    for lock in locks:
        if held and lock in held:
            try:
                lock.release()
            except RuntimeError:  # not taken: lent by the caller this callback works for
                pass
        else:
            lock.release()


class using:
    """``with using(a, b, ...):`` around a call that uses the objects: inside the gate (no close
    or reset meanwhile), holding the objects' locks (None and objects without one skipped).
    ``gate=False``: the locks only, for contexts' op constructors and walks of their tensors
    (a close takes every context's lock). Keeps no state of a thread: threads may share one (a
    graph's check caches the one of its compute)."""

    __slots__ = ("locks", "gate")

    def __init__(self, *objs: Any, gate: bool = True):
        self.locks = _locks_of(objs)
        self.gate = gate

    def __enter__(self) -> None:
        if self.gate:
            ident = _enter_gate()
            try:
                _take(self.locks)
            except BaseException:
                _leave_gate(ident)
                raise
        else:
            _take(self.locks)

    def __exit__(self, *exc: object) -> None:
        _give_back(self.locks)
        if self.gate:
            _leave_gate(_ident())

    def hold(self) -> "Held":
        """Enter now; the :class:`Held` returned lets go on ``with`` exit (or ``release()``)."""
        self.__enter__()
        return Held(self)


class Held:
    """A :class:`using` entered already (:meth:`using.hold`)."""

    __slots__ = ("using",)

    def __init__(self, held: using):
        self.using = held

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        self.using.__exit__()

    release = __exit__


# ---------------------------------------------------------------------------- closes
class closing:
    """``with closing():`` around a close or reset: waits until no other thread is inside a call
    and holds every context's lock; RuntimeError, with nothing changed, inside a call on this
    thread (a callback: C would go on with freed memory). Also a decorator of ``close`` and
    ``reset`` methods (:func:`closes`)."""

    __slots__ = ("locks", "nested")

    def __enter__(self) -> None:
        global _writer, _depth, changes
        ident = _ident()
        self.locks: tuple[Any, ...] = ()
        self.nested = _writer == ident
        if self.nested:
            _depth += 1
            return
        if _inside_call(ident):
            raise RuntimeError("cannot close or reset a pyggml object from inside a pyggml call on the "
                               "same thread (a callback): C may go on using what it frees")
        _writers.acquire()
        _writer = ident
        try:
            with _cond:
                while _readers:
                    _cond.wait(0.05)
            self.locks = _context_locks()
            _take(self.locks)
        except BaseException:  # (Ctrl-C while waiting): the gate opens again, nothing closed
            _writer = None
            with _cond:
                _cond.notify_all()
            _writers.release()
            raise
        changes += 1

    def __exit__(self, *exc: object) -> None:
        global _writer, _depth, changes
        if self.nested:
            _depth -= 1
            return
        changes += 1
        deferred = _deferred[:] if _deferred else ()
        del _deferred[:len(deferred)]
        try:
            for obj in deferred:  # collected meanwhile: closed here, where nothing waits
                _close_quietly(obj)
        finally:
            _give_back(self.locks)
            _writer = None
            with _cond:
                _cond.notify_all()
            _writers.release()


def closes(fn: _Fn) -> _Fn:
    """Decorator of ``close`` and ``reset`` methods: they run as :class:`closing` says."""
    @functools.wraps(fn)
    def closes(*args: Any, **kwargs: Any) -> Any:
        with closing():
            return fn(*args, **kwargs)
    closes._closes = True  # type: ignore[attr-defined]
    return closes  # type: ignore[return-value]


def close_later(obj: Any) -> None:
    """``obj.close()`` from ``__del__``: now if nothing would make it wait, else later (see the
    module docstring)."""
    _deferred.append(obj)
    if _writer is None and not _readers and _local.lent is None:
        _close_deferred()


def _close_deferred() -> None:
    """Close the deferred objects if the gate and every context's lock are free now (never
    waits: runs at the end of calls and from finalizers)."""
    global _writer
    if not _writers.acquire(False):
        return
    got: list[Any] = []
    try:
        if _readers or _writer is not None:
            return
        _writer = _ident()  # new calls of other threads wait from here on
        if _readers:  # one entered meanwhile
            return
        for lock in _context_locks():
            if not lock.acquire(False):
                return
            got.append(lock)
        while _deferred:
            _close_quietly(_deferred.pop())
    finally:
        for lock in got:
            lock.release()
        _writer = None
        _writers.release()
        with _cond:
            _cond.notify_all()


def _close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception:  # noqa: BLE001 - as in __del__: nothing may escape
        pass


# ---------------------------------------------------------------------------- callbacks
_owned: list[Any] = []  # open calls that declared owners (calling blocks), on any thread
_owned_lock = threading.Lock()


def declare(frame: Any) -> None:
    """An open call (``frame``: a :class:`pyggml.raw.boundary.calling` with ``owners`` and
    ``held``) whose owners' callbacks may run on ggml's threads."""
    with _owned_lock:
        _owned.append(frame)


def undeclare(frame: Any) -> None:
    with _owned_lock:
        _owned.remove(frame)


def owner_frame(owner: Any) -> Any:
    """The innermost open call, on any thread, that declared ``owner`` (:func:`declare`), or None."""
    with _owned_lock:
        for frame in reversed(_owned):
            if any(o is owner for o in frame.owners):
                return frame
    return None


class on_behalf:
    """``with on_behalf(owner):`` around a Python callback of ``owner`` (a custom op of a
    context) that may run on a thread ggml started while the thread that called C waits for
    it: on such a thread the gate and the locks that call holds (``calling(owner, held=...)``,
    :mod:`pyggml.raw.boundary`) count as this thread's: the callback's pyggml calls neither wait
    for them nor release them, and its close or reset raises RuntimeError. A no-op on a thread
    with a call of its own."""

    __slots__ = ("prev", "active")

    def __init__(self, owner: Any):
        self.active = False
        if _ident() in _readers:
            return
        frame = owner_frame(owner)
        if frame is not None:
            self.prev = _local.lent
            _local.lent = tuple(frame.held)
            self.active = True

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        if self.active:
            _local.lent = self.prev


def live_contexts() -> list[Any]:
    """Every context object not yet collected (open or closed)."""
    with _contexts_lock:
        return [c for c in (r() for r in _contexts) if c is not None]
