"""The lowering table: ATen overload -> :class:`Lowering`, filled by the ``ops_*`` modules.

A lowering's ``check`` reads only the FX node (its arguments and the fake tensors torch recorded
in ``node.meta["val"]``) and never raises: it returns why ggml cannot take the node, or None.
:func:`why_not` adds what every lowering needs (static shapes of at most 4 dims, float32
tensors, index tensors where the lowering says). ``lower`` builds the node with checked
:class:`~pyggml.core.context.Context` methods only.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, cast

import torch
from torch import fx

from ..core.tensor import Tensor
from .layout import DTYPES, INDEX_DTYPES, MAX_DIMS, is_static, val

__all__ = ["Val", "Lowering", "TABLE", "register", "why_not", "LoweringError", "args_of", "kw_of", "CheckFn",
           "int_bound", "constant_value", "SMALL_INT", "EXACT_INT"]


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
    ``int_results`` (the lowering takes integer and bool tensors too: I32 and F32 0/1 in ggml,
    e.g. the views and copies of position ids and masks), ``makes_values`` (with ``int_results``: it computes integers, not
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
    if ints and (v.dtype in INDEX_DTYPES or v.dtype == torch.bool):   # bools: F32 0/1 in ggml
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
#: difference of two of them stays within 2^24, where float32 holds every integer): the bound a
#: call checks the graph inputs whose integers ggml computes on against
SMALL_INT = 2**23
#: float32 holds every integer of at most this magnitude
EXACT_INT = 2**24


def int_bound(node: fx.Node) -> tuple[list[fx.Node], int | None, str | None]:
    """How large the values of integer (or bool) tensor ``node`` may be, for exact arithmetic
    in float32: ``(sources, bound, None)``, the graph inputs (placeholders) they come from
    (each call checks that those hold at most :data:`SMALL_INT` in magnitude) and a bound on
    their magnitude, through moves (views, copies, ``cat``, ``gather``), constants made from
    numbers (their largest number) and from the graph's symbolic sizes (inputs too), sums and
    products (the operands' bounds added or multiplied) and cumulative sums (times the dim's
    size), each at most :data:`EXACT_INT`; or ``([], None, why)``."""
    memo: dict[fx.Node, tuple[list[fx.Node], int]] = {}

    def bound(n: fx.Node) -> tuple[list[fx.Node], int]:
        if n in memo:
            return memo[n]
        v = val(n)
        if isinstance(v, torch.Tensor) and v.dtype == torch.bool:
            out: tuple[list[fx.Node], int] = ([], 1)
        elif n.op == "placeholder":
            out = ([n], SMALL_INT)
        else:
            lowering = TABLE.get(n.target) if n.op == "call_function" else None
            if lowering is None or not lowering.int_results:
                raise _Unbounded(f"integers computed by {n.target} in torch")
            nums = [abs(a) for a in list(n.args) + list(n.kwargs.values())
                    if isinstance(a, (int, float)) and not isinstance(a, bool)]
            parts = [bound(x) for x in n.all_input_nodes
                     if isinstance(val(x), torch.Tensor) and (val(x).dtype in INDEX_DTYPES or val(x).dtype == torch.bool)]
            sources = [p for ps, _ in parts for p in ps]
            if not lowering.makes_values and parts:   # moved
                out = (sources, max(b for _, b in parts))
            elif not lowering.makes_values:   # a constant of these numbers and sizes
                sizes = [x for x in n.all_input_nodes if not isinstance(val(x), torch.Tensor)]
                for x in sizes:   # a symbolic size: an input of the graph, checked at each call
                    if x.op != "placeholder":
                        raise _Unbounded(f"a constant made from a size computed in the graph ({x.name})")
                out = (sizes, max([int(a) for a in nums] + [SMALL_INT] * len(sizes) + [0]))
            elif n.target in _SUMS or n.target in _PRODUCTS:   # each operand counts (x + x: both)
                each = [bound(x)[1] if isinstance(x, fx.Node) else abs(int(cast(Any, x))) for x in n.args[:2]]
                out = (sources, each[0] + each[1] if n.target in _SUMS else each[0] * each[1])
            elif n.target == torch.ops.aten.cumsum.default:   # at most the dim's size times the largest
                size = val(n.args[0]).shape[n.args[1]]
                if not isinstance(size, int):
                    raise _Unbounded("a cumulative sum along a dim of symbolic size")
                out = (sources, parts[0][1] * size)
            else:
                raise _Unbounded(f"integers computed by {n.target}")
            if out[1] > EXACT_INT:
                raise _Unbounded(f"integers of up to {out[1]} (beyond {EXACT_INT}, where float32 is exact)")
        memo[n] = out
        return out

    try:
        sources, b = bound(node)
    except _Unbounded as e:
        return [], None, str(e)
    return sorted(set(sources), key=lambda p: p.name), b, None


class _Unbounded(Exception):
    pass


#: the integer sums and products int_bound follows (lowered by ops_elementwise)
_SUMS = {torch.ops.aten.add.Tensor, torch.ops.aten.add.Scalar, torch.ops.aten.sub.Tensor, torch.ops.aten.sub.Scalar}
_PRODUCTS = {torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Scalar}


def constant_value(b: Any, node: fx.Node) -> torch.Tensor:
    """The value of ``node``, a tensor made from numbers only (creation ops, moves and sums of
    their results: where :func:`int_bound` finds no graph inputs), computed by
    torch when the graph is built (``b``: the Builder; a size of a dynamic graph is the int it
    holds). Raises LoweringError for a node made from anything else."""
    def value(a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        if not isinstance(a, fx.Node):
            return a
        got = b.env.get(a)
        if isinstance(got, int):
            return got
        lowering = TABLE.get(a.target) if a.op == "call_function" else None
        if lowering is None or not lowering.int_results:
            raise LoweringError(f"{a.format_node()} is not made from numbers")
        kwargs = {k: value(v) for k, v in a.kwargs.items()}
        return cast(Callable[..., Any], a.target)(*value(a.args), **kwargs)
    out = value(node)
    if not isinstance(out, torch.Tensor):
        raise LoweringError(f"{node.format_node()} is not a tensor")
    return out


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
