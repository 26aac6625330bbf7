"""The call boundary: how an exception raised by Python code that C called reaches the Python
code that called C.

**The rule.** Every pyggml call into C that may call back into Python (a Python backend's vtable
slot, the log callback, the CPU backend's abort callback, a custom op, an eval or optimizer
callback) runs inside :class:`calling`. When the C call returns, ``calling`` raises the exception
that a callback raised during it, chained to the failure the C side reported (``raise exc from
GGMLError(...)``), or alone where C reported none (void slots such as ``clear``,
``memset_tensor``, ``synchronize``, ``get_tensor``: ggml ignores their failure, pyggml does not).
Nothing stays pending for a later call and nothing is printed at exit.

Meanwhile C sees each callback type's failure value (``GGML_STATUS_FAILED``, ``NULL``, ``false``,
``true`` for abort callbacks: :func:`pyggml.raw.callbacks.error_value`), so it stops or fails
where it can.

Which call an exception belongs to:

* a callback on a thread where a :class:`calling` block is open belongs to the innermost one
  (nested blocks happen when a Python backend calls pyggml, which calls C again);
* a callback on a thread ggml started itself (CPU worker threads running a custom op) belongs to
  the open block that declared the callback's *owner* (``calling(owner)``: e.g. a graph's
  context, which owns its custom ops);
* otherwise (a raw ``lib`` call outside any block, a C++ thread of another program) there is no
  Python caller to raise it to: it goes to :func:`sys.unraisablehook`, as exceptions in
  ``__del__`` do, and C still sees the failure value.

**Locks of a waiting caller.** A block declares what its thread holds for the call
(``calling(owner, held=locks)``); :class:`pyggml.raw.threads.on_behalf` lends them to callbacks of
``owner`` on ggml's threads (:func:`owner_frame` finds the block).

Raw-API users who want the same behaviour wrap their ``lib`` calls: ``with calling(): ...``.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

from ..errors import GGMLError
from . import ffi, lib, threads
from .threads import owner_frame

__all__ = ["calling", "call", "call_status", "record", "check_status", "status_name", "GGMLError"]


class _Local(threading.local):
    def __init__(self) -> None:
        self.frames: list[calling] = []


_local = _Local()
_lock = threading.Lock()


class calling:
    """``with calling(*owners):`` around C calls that may call back into Python; see the module
    docstring. ``owners`` are the objects whose callbacks may run on threads ggml starts (e.g. the
    context of a graph with custom ops). Usable as a decorator-free context manager only; cheap
    (a list push and pop) when no callback fails and no owner is declared. The open block is
    its own frame: ``errors`` collects what callbacks raised during it. ``held``: the locks this
    thread holds for the call, lent to callbacks of the owners on ggml's threads
    (:class:`pyggml.raw.threads.on_behalf`)."""

    __slots__ = ("errors", "owners", "held", "token")

    def __init__(self, *owners: Any, held: tuple[Any, ...] = ()):
        self.errors: list[BaseException] | None = None  # a list from the first one on
        self.owners = owners
        self.held = held

    def __enter__(self) -> "calling":
        self.token = threads.enter()  # a call: closes on other threads wait for it
        _local.frames.append(self)
        if self.owners:
            threads.declare(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        _local.frames.pop()
        if self.owners:
            threads.undeclare(self)
        threads.leave(self.token)
        if self.errors is not None:
            self._raise(exc)

    def _raise(self, exc: BaseException | None) -> None:
        """Raise the first exception the callbacks raised (chained to ``exc``, the C call's own
        failure, if any), noting how many more there were."""
        errors = self.errors
        assert errors is not None
        first = errors[0]
        if len(errors) > 1 and hasattr(first, "add_note"):
            first.add_note(f"({len(errors) - 1} more exception(s) raised by callbacks during the "
                           f"same call: {', '.join(repr(e) for e in errors[1:4])})")
        if exc is not None and exc is not first:
            raise first from exc
        raise first

    def _add(self, exc: BaseException) -> None:
        if self.errors is None:
            self.errors = [exc]
        else:
            self.errors.append(exc)


def _call(fn: Any, args: tuple[Any, ...]) -> tuple[Any, calling]:
    """``fn(*args)`` inside a :class:`calling` frame of no owner, built without the ``with``
    statement (about half its cost): (the result, the frame, whose ``errors`` the caller
    raises)."""
    frame = _new_frame(calling)
    frame.errors = None
    frame.owners = ()
    frames = _local.frames
    token = threads.enter()
    frames.append(frame)
    try:
        result = fn(*args)
    finally:
        frames.pop()
        threads.leave(token)
    return result, frame


def call(fn: Any, *args: Any) -> Any:
    """``with calling(): return fn(*args)`` (no owner to declare), the short form for a hot
    path (a tensor's set or get): returns what ``fn`` returned, or raises what a callback
    raised during it."""
    result, frame = _call(fn, args)
    if frame.errors is not None:
        frame._raise(None)
    return result


def call_status(what: str, fn: Any, *args: Any) -> None:
    """``with calling(): check_status(fn(*args), what)`` (``fn`` a C function returning a
    ``ggml_status``, with no owner to declare), the short form for a hot path (a compute):
    raises what a callback raised, chained to the GGMLError of a failed status, or that
    GGMLError."""
    status, frame = _call(fn, args)
    failure = None if status == _SUCCESS else GGMLError(f"{what} failed: {status_name(status)}", status)
    if frame.errors is not None:
        frame._raise(failure)
    if failure is not None:
        raise failure


_new_frame = object.__new__
_SUCCESS = int(lib.GGML_STATUS_SUCCESS)


def record(exc: BaseException, owner: Any = None) -> None:
    """Called by the trampolines of :mod:`pyggml.raw.callbacks` with the exception a Python
    callback raised: hand it to the call it belongs to (see the module docstring)."""
    frames = _local.frames
    if frames:
        frames[-1]._add(exc)
        return
    frame = owner_frame(owner) if owner is not None else None
    if frame is not None:
        with _lock:  # worker threads of one call may record at once
            frame._add(exc)
        return
    sys.unraisablehook(_unraisable(exc, "a pyggml callback raised outside any pyggml call into C"))


def _hook_args_type() -> Any:
    """CPython's ``UnraisableHookArgs`` (not exposed by name): the builtin hook,
    ``sys.__unraisablehook__``, takes nothing else (TypeError). Found by catching the argument
    of one unraisable exception (a ``__del__`` that raises) with a temporary hook."""
    got: list[Any] = []

    class _Raises:
        def __del__(self) -> None:
            raise RuntimeError("pyggml: finding UnraisableHookArgs")

    old = sys.unraisablehook
    sys.unraisablehook = got.append
    try:
        _Raises()
    finally:
        sys.unraisablehook = old
    return type(got[0])


_HookArgs = _hook_args_type()


def _unraisable(exc: BaseException, message: str) -> Any:
    """The argument of :func:`sys.unraisablehook` for ``exc``: an ``UnraisableHookArgs``
    (exc_type, exc_value, exc_traceback, err_msg, object)."""
    return _HookArgs((type(exc), exc, exc.__traceback__, message, None))


def status_name(status: int) -> str:
    """``ggml_status_to_string``: ``"GGML status: error (operation failed)"``..."""
    return ffi.string(lib.ggml_status_to_string(status)).decode()


def check_status(status: int, what: str) -> None:
    """Raise :class:`~pyggml.errors.GGMLError` unless ``status`` is ``GGML_STATUS_SUCCESS``;
    ``what`` names the C call (inside :class:`calling`, a callback's exception then wins and is
    chained to this one)."""
    if status != lib.GGML_STATUS_SUCCESS:
        raise GGMLError(f"{what} failed: {status_name(status)}", status)
