"""Comparisons and logical ops: bool tensors are F32 0/1 in ggml (as bool inputs are fed), and
integers are compared as the difference of two small ones in float32 (operands as
:func:`~pyggml.torch_lowering.table.int_bound` bounds them: exact), read by
``ggml_step`` (1 where positive). Only integer and bool operands: a float comparison would
need NaN's rule (``ggml_step`` of NaN is 0), so it stays in torch. These make the masks
transformers builds (``ge``, ``bitwise_and`` of a padding mask and a causal one) on ggml."""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ..core.tensor import Tensor
from .graph import Builder
from .layout import INDEX_DTYPES, val
from .ops_elementwise import binary
from .table import EXACT_INT, args_of, int_bound, register

aten = torch.ops.aten


def _operand_bound(x: Any) -> tuple[int | None, str | None]:
    """How large operand ``x`` may be (:func:`~pyggml.torch_lowering.table.int_bound`), or why
    it cannot be compared on ggml: a float."""
    if isinstance(x, bool):
        return 1, None
    if isinstance(x, int):
        return abs(x), None
    if not isinstance(x, fx.Node):
        return None, f"an operand {x!r} (integers and bools are compared on ggml)"
    dtype = val(x).dtype
    if dtype != torch.bool and dtype not in INDEX_DTYPES:
        return None, f"a {dtype} operand (integers and bools are compared on ggml: a float's NaN would not)"
    _, bound, why = int_bound(x)
    return bound, why


def _compare_check(node: fx.Node) -> str | None:
    total = 0
    for x in args_of(node)[:2]:
        bound, why = _operand_bound(x)
        if why is not None:
            return why
        total += bound or 0
    return None if total <= EXACT_INT else f"a difference of up to {total} (beyond {EXACT_INT})"


def _one_minus(b: Builder, t: Tensor) -> Tensor:
    return b.ctx.add(b.ctx.scale(t, -1.0), b.constant([1.0]))


def _compare(op: str) -> Any:
    def lower(b: Builder, node: fx.Node, x: Any, y: Any) -> Tensor:
        ctx = b.ctx
        d = binary(b, node, b.as_f32(x), b.as_f32(y), "sub")   # exact: small integers, 0/1
        if op == "gt":
            return ctx.step(d)
        if op == "lt":
            return ctx.step(ctx.neg(d))
        if op == "ge":
            return ctx.step(ctx.add(d, b.constant([0.5])))
        if op == "le":
            return ctx.step(ctx.add(ctx.neg(d), b.constant([0.5])))
        differ = ctx.step(ctx.abs(d))
        return differ if op == "ne" else _one_minus(b, differ)
    return lower


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(getattr(aten, _op).Scalar, getattr(aten, _op).Tensor, check=_compare_check, int_results=True,
             makes_values=True, notes=f"integers (proven small) and bools: ggml_step of their difference in "
                                      f"float32 (F32 0/1, as ggml holds bools)")(_compare(_op))


def _bools_check(node: fx.Node) -> str | None:
    for x in args_of(node)[:2]:
        if isinstance(x, fx.Node) and val(x).dtype != torch.bool:
            return f"a {val(x).dtype} operand (bools only)"
        if not isinstance(x, (fx.Node, bool)):
            return f"an operand {x!r}"
    return None


def _logical(op: str) -> Any:
    def lower(b: Builder, node: fx.Node, x: Any, y: Any = None) -> Tensor:
        ctx = b.ctx
        if op == "not":
            return _one_minus(b, b.contig(x.t))
        x, y = b.as_f32(x), b.as_f32(y)
        if op == "and":
            return binary(b, node, x, y, "mul")
        if op == "xor":
            return ctx.abs(binary(b, node, x, y, "sub"))
        both = binary(b, node, x, y, "mul")        # or: a + b - ab
        return ctx.sub(binary(b, node, x, y, "add"), both)
    return lower


register(aten.bitwise_and.Tensor, aten.logical_and.default, check=_bools_check, int_results=True, makes_values=True,
         notes="bools (F32 0/1): ggml_mul")(_logical("and"))
register(aten.bitwise_or.Tensor, aten.logical_or.default, check=_bools_check, int_results=True, makes_values=True,
         notes="bools (F32 0/1): a + b - a·b")(_logical("or"))
register(aten.bitwise_xor.Tensor, aten.logical_xor.default, check=_bools_check, int_results=True,
         makes_values=True, notes="bools (F32 0/1): the absolute difference")(_logical("xor"))
register(aten.bitwise_not.default, aten.logical_not.default, check=_bools_check, int_results=True,
         makes_values=True, notes="bools (F32 0/1): 1 - a")(_logical("not"))
