"""How a Python object becomes a C struct with a vtable that ggml calls.

Every Python backend object (:class:`_Impl`) owns a C struct made with ``ffi.new`` whose
``context`` is a handle (``ffi.new_handle``) to a router object, and whose ``iface`` holds, for
each slot the subclass implements, the generated ``extern "Python"`` trampoline of that slot
(:func:`pyggml.raw.callbacks.slot`). A trampoline finds the router from ``context`` and calls
``impl._c_<slot>(*c_args)``, which converts the C arguments to pyggml objects and calls the
subclass's method. Slots a subclass does not implement stay NULL, so ggml's fallback applies.

Lifetimes: a struct whose pointer ggml holds (a buffer, a backend, an event) is kept in
:data:`LIVE` from when the Python side hands it to ggml until ggml frees it (the ``free`` slot).
Tensors and graphs handed to a method are lent for that call only (:func:`lent`).
"""
from __future__ import annotations

import abc
from contextlib import contextmanager
from typing import Any, Iterator

from ..raw import boundary, callbacks, ffi
from ..core.tensor import BorrowScope

__all__ = ["Impl", "LIVE", "addr", "make_struct", "fill_iface", "lent", "safe", "SIZE_MAX"]

SIZE_MAX = 2**64 - 1 if ffi.sizeof("size_t") == 8 else 2**32 - 1

#: objects ggml holds raw pointers to, by address: kept alive until ggml frees them
LIVE: dict[int, Any] = {}


def addr(p: Any) -> int:
    """The address of C pointer ``p``."""
    return int(ffi.cast("uintptr_t", p))


@contextmanager
def lent(what: str) -> Iterator[BorrowScope]:
    """The scope of the tensors and graphs ggml hands to one call of a Python method: they are
    usable during the call and raise ClosedError afterwards."""
    scope = BorrowScope(what)
    try:
        yield scope
    finally:
        scope.close()


def safe(impl: "Impl", exc: BaseException, fallback: Any) -> Any:
    """For slots whose C failure value ggml cannot survive (a NULL name it passes to strcmp, an
    alignment of 0 it divides by, a NULL buffer type it dereferences): hand ``exc`` to the
    pyggml call in progress (:mod:`pyggml.raw.boundary`, which raises it when C returns) and give
    C ``fallback``, a value it can go on with."""
    boundary.record(exc, impl)
    return fallback


class Impl(abc.ABC):
    """Common plumbing of the five interfaces: a Python-owned C struct (``_struct``) whose
    ``context`` is a handle to a router for ``self``, and whose ``iface`` (``struct _iface``)
    holds a trampoline for each slot ``self`` implements (``_c_<slot>``)."""

    _iface: str = ""
    _struct: str = ""
    _c: Any
    _router: Any
    _handle: Any
    _strings: dict[str, Any]

    def _implements(self, member: str) -> bool:
        """A slot is filled when the Python method behind it exists (abstract ones always do)."""
        return callable(getattr(self, member, None))

    def _cstr(self, s: str) -> Any:
        """``s`` as a C string that lives as long as this object (ggml keeps the pointer)."""
        if s not in self._strings:
            self._strings[s] = ffi.new("char[]", s.encode())
        return self._strings[s]


class _SlotRouter:
    """The object behind a C struct's ``context`` handle: slot name -> ``impl._c_<slot>``.
    ``owner`` is what an exception of a slot is attributed to (see pyggml.raw.boundary)."""

    def __init__(self, impl: Impl):
        self.impl = impl
        self.owner = impl

    def __getattr__(self, member: str) -> Any:
        return getattr(self.impl, "_c_" + member)


def fill_iface(impl: Impl, iface: Any) -> None:
    """Give ``impl`` its context handle and put a trampoline in each slot of ``iface`` (a
    ``struct <impl._iface>``) that ``impl`` implements; the other slots stay NULL."""
    impl._router = _SlotRouter(impl)
    impl._handle = ffi.new_handle(impl._router)
    impl._strings = {}
    for member, _ in ffi.typeof(f"struct {impl._iface}").fields:
        if impl._implements(member):
            setattr(iface, member, callbacks.slot(impl._iface, member))


def make_struct(impl: Impl) -> Any:
    """The C struct (``struct <impl._struct>``) of ``impl``, vtable filled, context set."""
    c = ffi.new(f"struct {impl._struct} *")
    impl._c = c
    fill_iface(impl, c.iface)
    c.context = impl._handle
    return c


def slot_arity(iface: str, member: str) -> int:
    """The number of parameters of vtable slot ``iface.member`` in the headers pyggml was built
    from (slots gain parameters between ggml versions: ``graph_optimize`` has 2 in ggml 0.20.2
    and 3 in 0.25.3)."""
    for name, field in ffi.typeof(f"struct {iface}").fields:
        if name == member:
            return len(field.type.args)
    raise KeyError(f"{iface} has no slot {member}")
