"""The lowering table: ATen overload -> :class:`Lowering`, filled by the ``ops_*`` modules.

A lowering's ``check`` reads only the FX node (its arguments and the fake tensors torch recorded
in ``node.meta["val"]``) and never raises: it returns why ggml cannot take the node, or None.
:func:`why_not` adds what every lowering needs (static shapes of at most 4 dims, float32
tensors, index tensors where the lowering says). ``lower`` builds the node with checked
:class:`~pyggml.core.context.Context` methods only.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
from torch import fx

from ..core.tensor import Tensor
from .layout import DTYPES, INDEX_DTYPES, MAX_DIMS, is_static, val

__all__ = ["Val", "Lowering", "TABLE", "register", "why_not", "LoweringError", "args_of", "kw_of", "CheckFn"]


def args_of(node: fx.Node) -> list[Any]:
    """``node.args`` as a list of plain values (FX types them as a wide union)."""
    return list(node.args)


def kw_of(node: fx.Node) -> dict[str, Any]:
    """``node.kwargs`` as a plain dict."""
    return dict(node.kwargs)


class LoweringError(ValueError):
    """A node pyggml cannot lower (raised before anything is built in C)."""


class Val(NamedTuple):
    """A lowered value: the ggml tensor and the torch shape it stands for."""
    t: Tensor
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)


# a lowering's check: why ggml cannot take the node, or None
CheckFn = Callable[[fx.Node], "str | None"]


class Lowering(NamedTuple):
    """How an ATen overload becomes ggml ops: ``name`` (``aten.add.Tensor``), ``lower``,
    ``notes`` (the ggml ops it makes, for the docs' table), ``check`` (extra conditions on the
    node), ``index_args`` (argument positions holding index tensors: I32 in ggml), ``mask_args``
    (positions or keyword names where a bool tensor is taken too: F32 0/1 in ggml),
    ``int_results`` (the lowering takes integer tensors too: I32 in ggml, e.g. the views and
    copies of position ids), ``makes_values`` (with ``int_results``: it computes integers, not
    only moves them or makes constants: a sum)."""
    name: str
    lower: Callable[..., Any]
    notes: str
    check: Callable[[fx.Node], "str | None"] | None = None
    index_args: tuple[int, ...] = ()
    mask_args: tuple[int | str, ...] = ()
    int_results: bool = False
    makes_values: bool = False


TABLE: dict[Any, Lowering] = {}


def register(*targets: Any, notes: str, check: Callable[[fx.Node], "str | None"] | None = None,
             index_args: tuple[int, ...] = (), mask_args: tuple[int | str, ...] = (),
             int_results: bool = False, makes_values: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``fn`` lowers each of ``targets`` (ATen overloads)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for target in targets:
            TABLE[target] = Lowering(str(target), fn, notes, check, index_args, mask_args, int_results,
                                     makes_values)
        return fn
    return deco


def _tensor_ok(v: Any, index: bool, mask: bool = False, ints: bool = False) -> str | None:
    if isinstance(v, (int, torch.SymInt)):
        return None   # a size (of a graph with dynamic shapes): an int when the graph is lowered
    if not isinstance(v, torch.Tensor):
        return "no fake tensor recorded"
    if v.dim() > MAX_DIMS:
        return f"{v.dim()} dims (ggml has at most {MAX_DIMS})"
    if is_static(v.shape) and v.numel() == 0:
        return "an empty tensor"
    if index:
        return None if v.dtype in INDEX_DTYPES else f"index dtype {v.dtype}"
    if ints and v.dtype in INDEX_DTYPES:
        return None
    if mask and v.dtype == torch.bool:
        return None
    return None if v.dtype in DTYPES else f"dtype {v.dtype}"


def _ints_from_torch(node: fx.Node) -> str | None:
    """Why an integer argument of ``node`` (a lowering that moves integers) keeps it in torch:
    one computed by a node that stays in torch, whose values may not fit I32 (T5's position
    buckets pass through int64's minimum); a graph input holding such values is refused when
    called (ValueError)."""
    for x in node.all_input_nodes:
        v = val(x)
        if x.op == "call_function" and isinstance(v, torch.Tensor) and v.dtype in INDEX_DTYPES \
                and why_not(x) is not None:
            return "an integer input computed in torch (int64 values that I32 may not hold)"
    return None


#: integers of at most this magnitude add and subtract exactly in ggml's float32 (a sum or a
#: difference of two of them stays within 2^24, where float32 holds every integer)
SMALL_INT = 2**23


def small_int_sources(node: fx.Node) -> tuple[list[fx.Node], str | None]:
    """Where the values of integer tensor ``node`` come from, for an exact sum in float32: the
    graph inputs (placeholders) they are moved from (through views, copies, ``cat``, ``gather``:
    each call checks that those hold at most :data:`SMALL_INT` in magnitude), and constants
    made from numbers of at most that magnitude (``arange``...). ``([], why)`` for values
    computed (a sum of sums may leave float32's exact range) or larger constants."""
    sources: list[fx.Node] = []
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            sources.append(n)
            continue
        lowering = TABLE.get(n.target) if n.op == "call_function" else None
        if lowering is None or not lowering.int_results or lowering.makes_values:
            return [], f"integers computed by {n.target} (a sum of them may leave float32's exact range)"
        if not n.all_input_nodes:   # a constant: its numbers bound its values
            nums = [a for a in list(n.args) + list(n.kwargs.values()) if isinstance(a, (int, float))
                    and not isinstance(a, bool)]
            if any(abs(a) > SMALL_INT for a in nums):
                return [], f"an integer constant beyond {SMALL_INT}"
            continue
        todo += [x for x in n.all_input_nodes if isinstance(val(x), torch.Tensor) and val(x).dtype in INDEX_DTYPES]
    return sources, None


def why_not(node: fx.Node) -> str | None:
    """Why ``node`` cannot be lowered to ggml, or None. Never raises."""
    try:
        if node.op != "call_function":
            return f"a {node.op} node"
        lowering = TABLE.get(node.target)
        if lowering is None:
            return f"{node.target} has no lowering"
        out = val(node)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        ints = lowering.int_results
        first = _tensor_ok(outs[0], False, ints=ints)
        if first is not None:
            return f"its result: {first}"
        for i, a in enumerate(node.args):
            items = a if isinstance(a, (list, tuple)) else (a,)
            for x in items:
                if isinstance(x, fx.Node) and not isinstance(val(x), (tuple, list)):  # a tuple: checked where made
                    why = _tensor_ok(val(x), i in lowering.index_args, i in lowering.mask_args, ints)
                    if why is not None:
                        return f"argument {i}: {why}"
        for k, x in node.kwargs.items():
            if isinstance(x, fx.Node):
                why = _tensor_ok(val(x), False, k in lowering.mask_args, ints)
                if why is not None:
                    return f"argument {k}: {why}"
        if ints:
            why = _ints_from_torch(node)
            if why is not None:
                return why
        return lowering.check(node) if lowering.check is not None else None
    except Exception as e:  # noqa: BLE001 - a check never raises: it says no
        return f"its check failed ({type(e).__name__}: {e})"
