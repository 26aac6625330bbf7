"""C callbacks written in Python, through cffi ``extern "Python"`` functions.

For every callback type in the pinned headers the extension carries one C function,
``lib.pyggml_cb_<type>`` (vtable slots: ``lib.pyggml_cb_<struct>__<slot>``), generated from the
headers; there are no ``ffi.callback`` trampolines (no writable+executable memory). This module
routes each call to Python, three ways (see :data:`SPECS`):

``userdata``
    The C type has a ``void *`` payload argument (``user_data``, ``userdata``, ``data``...). Wrap a
    Python callable in a :class:`Callback` and pass ``cb.fn`` and ``cb.user_data`` to C::

        cb = Callback("ggml_log_callback", lambda level, text, ud: print(ffi.string(text)))
        lib.ggml_log_set(cb.fn, cb.user_data)      # keep ``cb`` alive while C may call it

``global``
    No payload argument (``ggml_abort_callback_t``, ``ggml_opt_epoch_callback``...): one Python
    callable per type and process, installed with :func:`set_global`.

``slot``
    A function-pointer member of a vtable struct of ggml-backend-impl.h. The owning C object's
    ``context`` must be a handle (``ffi.new_handle``) to a Python object with a method named
    after the slot; :func:`slot` gives the C function to store in the vtable.

In every case the Python function receives the C arguments as cffi objects, unchanged.

Errors: cffi returns 0 from a callback that raised, and 0 is ``GGML_STATUS_SUCCESS``. Every
trampoline here is defined with an explicit error value (:func:`error_value`): ``enum ggml_status``
gives ``GGML_STATUS_FAILED``, ``bool`` gives ``false`` (for ``ggml_abort_callback``: ``true``, i.e.
abort the computation), pointers give ``NULL``, numbers 0, structs all zero. The exception itself
goes to the pyggml call that entered C (:mod:`pyggml.raw.boundary`, which states the rule), and
is logged at DEBUG level on the ``pyggml.callbacks`` logger.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

from . import boundary, ffi, lib
from ._callback_table import CALLBACKS

__all__ = ["CallbackSpec", "SPECS", "Callback", "function", "slot", "set_global", "error_value",
           "calling"]

#: see :mod:`pyggml.raw.boundary`
calling = boundary.calling

logger = logging.getLogger("pyggml.callbacks")


class CallbackSpec(NamedTuple):
    name: str    #: extern "Python" function in ``lib``
    ctype: str   #: C typedef name, or ``"struct <name>.<member>"`` for a vtable slot
    kind: str    #: ``"userdata"``, ``"global"`` or ``"slot"``
    index: int | None  # type: ignore[assignment]  # (shadows tuple.index) position of the payload (userdata) or owner (slot) argument
    error: Any   #: value C receives when the Python function raises


#: callbacks whose ``bool`` result means "stop": on error they must stop, i.e. return true
_TRUE_MEANS_STOP = {"ggml_abort_callback"}


def error_value(ctype: str, result: Any) -> Any:
    """The value a trampoline for ``ctype`` (result type ``result``, a cffi ctype) returns when
    its Python function raises. ``None`` lets cffi use its zero default (NULL, 0, all-zero
    struct), which is never a success status: those are listed explicitly."""
    if result.kind == "enum" and result.cname == "enum ggml_status":
        return lib.GGML_STATUS_FAILED
    if result.kind == "primitive" and result.cname == "_Bool":
        return ctype in _TRUE_MEANS_STOP
    return None


def _specs() -> dict[str, CallbackSpec]:
    out = {}
    for name, ctype, kind, index in CALLBACKS:
        result = ffi.typeof(getattr(lib, name)).result
        out[ctype] = CallbackSpec(name, ctype, kind, index, error_value(ctype, result))
    return out


#: Every callback type of the headers, keyed by C type (``"ggml_log_callback"``,
#: ``"struct ggml_backend_i.graph_compute"``...).
SPECS: dict[str, CallbackSpec] = _specs()

_globals: dict[str, Callable[..., Any] | None] = {}


def _onerror(spec: CallbackSpec) -> Callable[[type[BaseException], BaseException, Any], None]:
    def onerror(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        logger.debug("exception in Python callback for %s; returning %r to ggml", spec.ctype,
                     spec.error, exc_info=(exc_type, exc, tb))
        boundary.record(exc, _current_owner(spec, tb))
        return None  # -> spec.error
    return onerror


def _current_owner(spec: CallbackSpec, tb: Any) -> Any:
    """The ``owner`` of the object behind the callback that raised (a :class:`Callback`, or the
    object of a vtable slot), read from the trampoline's frame (the traceback's first); None if
    it has none."""
    cb = tb.tb_frame.f_locals.get("cb") if tb is not None else None
    return getattr(cb, "owner", None)


def _from_handle(handle: Any) -> Any:
    if handle == ffi.NULL:  # ffi.from_handle(NULL) would crash
        raise ValueError("callback payload is NULL: pass the user_data of a pyggml Callback")
    return ffi.from_handle(handle)


def _install(spec: CallbackSpec) -> None:
    trampoline: Callable[..., Any]
    if spec.kind == "userdata":
        assert spec.index is not None
        i = spec.index

        def trampoline(*args: Any) -> Any:
            cb = _from_handle(args[i])
            return cb.func(*args)
    elif spec.kind == "slot":
        assert spec.index is not None
        i, method = spec.index, spec.ctype.rsplit(".", 1)[1]

        def trampoline(*args: Any) -> Any:
            if args[i] == ffi.NULL:
                raise ValueError(f"{spec.ctype} called with a NULL owner")
            cb = _from_handle(args[i].context)
            return getattr(cb, method)(*args)
    else:
        def trampoline(*args: Any) -> Any:
            func = _globals.get(spec.ctype)
            if func is None:
                raise RuntimeError(f"no Python function is set for {spec.ctype}: use set_global()")
            return func(*args)
    trampoline.__name__ = spec.name
    kw = {} if spec.error is None else {"error": spec.error}
    ffi.def_extern(name=spec.name, onerror=_onerror(spec), **kw)(trampoline)


for _s in SPECS.values():
    _install(_s)


def _spec(ctype: str, kind: str | None = None) -> CallbackSpec:
    try:
        spec = SPECS[ctype]
    except KeyError:
        raise KeyError(f"{ctype!r} is not a callback type of the ggml headers") from None
    if kind is not None and spec.kind != kind:
        raise TypeError(f"{ctype} is dispatched as {spec.kind!r}, not {kind!r}")
    return spec


def function(ctype: str) -> Any:
    """The C function pointer (``ctype``) of the trampoline for callback type ``ctype``."""
    return ffi.addressof(lib, _spec(ctype).name)


def slot(struct: str, member: str) -> Any:
    """The C function for vtable slot ``struct.member`` (e.g. ``slot("ggml_backend_i",
    "graph_compute")``), dispatched to ``ffi.from_handle(owner.context).<member>(*args)``."""
    _spec(f"struct {struct}.{member}", "slot")
    return function(f"struct {struct}.{member}")


class Callback:
    """A Python callable behind a C callback type that has a ``void *`` payload argument.

    ``fn`` is the C function pointer, ``user_data`` the payload to pass with it. The C side only
    holds a borrowed handle: keep this object alive as long as C may call it (pyggml's objects
    keep theirs). ``owner``: the object an exception of ``func`` is attributed to when it runs on
    a thread ggml started (see :mod:`pyggml.raw.boundary`).

    Raises ``KeyError`` for an unknown callback type and ``TypeError`` for a type without a
    payload argument (use :func:`set_global`).
    """

    def __init__(self, ctype: str, func: Callable[..., Any], owner: Any = None):
        self.spec = _spec(ctype, "userdata")
        self.func = func
        self.owner = owner
        self.fn = function(ctype)
        self.user_data = ffi.new_handle(self)

    def __repr__(self) -> str:
        return f"<Callback {self.spec.ctype} -> {self.func!r}>"


def set_global(ctype: str, func: Callable[..., Any] | None) -> Any:
    """Route the process-wide callback type ``ctype`` to ``func`` (``None`` clears it: calls then
    fail with the error value). Returns the C function pointer to hand to ggml."""
    _spec(ctype, "global")
    _globals[ctype] = func
    return function(ctype)
