"""What pyggml's Python backends share: a kernel table and a device's cached ``supports_op``.

A :class:`KernelTable` maps ``GGML_OP_*`` to a backend's entries (a NamedTuple per backend,
e.g. :class:`pyggml.impl.numpy.OpImpl` with ``compute``, :class:`pyggml.impl.torch.table.OpImpl`
with ``build``); every entry has ``name``, ``supports(ptr) -> bool`` and, for an op with sub-ops
or modes (UNARY, GLU, ROPE...), ``variant(ptr) -> int`` and the ``variants`` its kernel
computes, checked before ``supports`` (:class:`OpRule`). :meth:`KernelTable.claims` is the
backends' ``supports(node)``: metadata only, never raises for a valid node.

A :class:`SupportCache` answers a device's ``supports_op`` from such a ``supports`` function,
once per (op, type, shape, strides, op_params, sources' types, shapes, strides and whether
they are views): a graph asks the same question for every layer.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

from ..core.tensor import EMPTY_OPS, Tensor
from ..raw import ffi, lib

__all__ = ["OpRule", "KernelTable", "SupportCache", "support_key", "op_id"]

#: what a rule or a sub-op reader may raise for a node it does not handle (a missing source,
#: an op parameter out of range...): not supported
SUPPORT_ERRORS = (ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError)


class OpRule(Protocol):
    """What :meth:`KernelTable.claims` reads of an entry."""

    @property
    def name(self) -> str: ...

    @property
    def supports(self) -> Callable[[Any], bool]: ...

    @property
    def variant(self) -> Callable[[Any], int] | None: ...

    @property
    def variants(self) -> frozenset[int]: ...


R = TypeVar("R", bound=OpRule)


def op_id(name: str) -> int:
    """``GGML_OP_<name>`` (``"MUL_MAT"`` -> ``GGML_OP_MUL_MAT``); AttributeError for an unknown
    name."""
    return int(getattr(lib, f"GGML_OP_{name}"))


class KernelTable(dict[int, R]):
    """``GGML_OP_*`` -> entry (a dict: ``OPS[op]``, ``OPS.get(op)`` as before)."""

    def claims(self, p: Any) -> bool:
        """Whether the entry of node ``p``'s op (a raw ``struct ggml_tensor *``) computes it:
        its sub-op is one of ``variants`` (when it has ``variant``) and its ``supports(p)`` is
        true. Only metadata is read; an error of the rule (``SUPPORT_ERRORS``) is False."""
        impl = self.get(int(p.op))
        if impl is None:
            return False
        try:
            if impl.variant is not None and impl.variant(p) not in impl.variants:
                return False
            return bool(impl.supports(p))
        except SUPPORT_ERRORS:
            return False

    def names(self) -> list[str]:
        """The names of the ops in the table, sorted."""
        return sorted(impl.name for impl in self.values())


def support_key(p: Any) -> tuple[Any, ...]:
    """What a kernel table's ``supports`` reads of node ``p`` (a raw ``struct ggml_tensor *``):
    op, type, ``ne``, ``nb``, op_params and, per source, type, ``ne``, ``nb`` and whether it
    is a view."""
    srcs = tuple((s.type, tuple(s.ne), tuple(s.nb), s.view_src != ffi.NULL)
                 for s in p.src if s != ffi.NULL)
    return (p.op, p.type, tuple(p.ne), tuple(p.nb), bytes(ffi.buffer(p.op_params)), srcs)


class SupportCache:
    """A device's ``supports_op``: ``supports(ptr)`` (e.g. a kernel table's
    :meth:`~KernelTable.claims`) asked once per :func:`support_key`; empty ops (NONE, VIEW,
    RESHAPE, PERMUTE, TRANSPOSE) are always supported::

        class MyDevice(PyDevice):
            def __init__(self):
                self._supports = SupportCache(OPS.claims)
                super().__init__()

            def supports_op(self, op):
                return self._supports(op)
    """

    def __init__(self, supports: Callable[[Any], bool]):
        self.supports = supports
        self.answers: dict[tuple[Any, ...], bool] = {}

    def __call__(self, op: Tensor) -> bool:
        p = op.ptr
        if p.op in EMPTY_OPS:
            return True
        key = support_key(p)
        hit = self.answers.get(key)
        if hit is None:
            hit = self.answers[key] = bool(self.supports(p))
        return hit
