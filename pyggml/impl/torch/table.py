"""The torch backend's kernel table: per ggml op, whether it is computed (``supports``) and how
to bind it (``build``).

A kernel is bound, not run: ``build(node, views)`` reads the node's metadata (types, ``ne``,
``nb``, op_params), takes torch views of the node and of its sources (``memory.Views``)
and returns a step, a callable of no arguments that computes the node from the *current* data
of those views (or None: nothing to compute). The backend runs the steps of a graph in order
and keeps them (``plan``): a step must therefore read every data-dependent value (row
indices, positions, AdamW parameters) when it runs, never when it is built. A step that must run
in Python on every compute (it reads data to the host, as ``.item()`` or ``.tolist()`` do, or
has shapes that depend on data) is marked with :func:`eager`: a plan holding one is never
captured into a CUDA graph (:mod:`pyggml.impl.torch.capture`).

Supports rules: where the computation is the NumPy backend's (same types, same semantics), its
rule is reused (:data:`pyggml.impl.numpy.OPS`), narrowed where torch computes less (quantized
types: only those of ``quant.DEQUANT``; no quantized destinations). Numerics follow ggml's
CPU backend as the NumPy backend does (float32 compute, the destination rounded by torch's
``copy_``: round-to-nearest-even for F16/BF16, truncation for integers; GELU through ggml's F16
rounding), with torch's float32 math functions.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple

from ...raw import ffi, lib
from ..kernel_table import KernelTable, op_id
from ..numpy import OPS as NUMPY_OPS

__all__ = ["OPS", "OpImpl", "supports", "build", "supported_op_names", "Step", "eager", "is_eager"]

#: a bound kernel: computes one node from the current data of its views (what it returns is
#: ignored: a torch call with ``out=`` returns its destination)
Step = Callable[[], object]


class OpImpl(NamedTuple):
    """One entry of ``OPS``: ``supports(ptr) -> bool`` and ``build(ptr, views) -> Step |
    None`` take the raw ``struct ggml_tensor *``; ``variant``/``variants`` name the sub-ops
    computed (UNARY, GLU, ROPE...), checked before ``supports``."""
    name: str
    supports: Callable[[Any], bool]
    build: Callable[[Any, Any], "Step | None"]
    notes: str
    variant: Callable[[Any], int] | None = None
    variants: frozenset[int] = frozenset()


_EAGER = "_pyggml_eager"


def eager(step: Step) -> Step:
    """Mark ``step`` (a function) as one that must run in Python at every compute (it reads data
    to the host or changes Python state) and return it."""
    setattr(step, _EAGER, True)
    return step


def is_eager(step: Step) -> bool:
    """Whether ``step`` was marked with :func:`eager`."""
    return bool(getattr(step, _EAGER, False))


#: GGML_OP_* -> ``OpImpl`` (a :class:`~pyggml.impl.kernel_table.KernelTable`)
OPS: KernelTable[OpImpl] = KernelTable()


def _add(name: str, sup: Callable[[Any], bool], build: Callable[[Any, Any], "Step | None"], notes: str, *,
         variant: Callable[[Any], int] | None = None, variants: Iterable[int] = ()) -> None:
    OPS[op_id(name)] = OpImpl(name, sup, build, notes, variant, frozenset(int(v) for v in variants))


def numpy_rule(name: str) -> Callable[[Any], bool]:
    """The NumPy backend's supports rule of op ``name`` (the same semantics)."""
    return NUMPY_OPS[op_id(name)].supports


def supports(p: Any) -> bool:
    """Whether :func:`pyggml.impl.torch.table.build` binds node ``p`` (a raw ``struct ggml_tensor *``) to a kernel that
    computes it correctly. Only metadata is read. Never raises for a valid node."""
    return OPS.claims(p)


def build(p: Any, views: Any) -> "Step | None":
    """The step computing node ``p`` on ``views`` (None: nothing to compute). Raises ValueError
    for a node :func:`supports` rejects or whose memory torch cannot see."""
    impl = OPS.get(int(p.op))
    if impl is None or not supports(p):
        name = ffi.string(p.name).decode("utf-8", "replace") or "(unnamed)"
        raise ValueError(f"the torch backend cannot compute node {name} "
                         f"({ffi.string(lib.ggml_op_desc(p)).decode()})")
    return impl.build(p, views)


def supported_op_names() -> list[str]:
    """The names of the ops in ``OPS``, sorted."""
    return OPS.names()
