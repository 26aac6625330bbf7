"""Matrix products: mm, addmm, bmm, linear, matmul, baddbmm.

``ggml_mul_mat(a, b)`` takes a ne [K, N] and b ne [K, M] and gives ne [N, M]: in NumPy order
``b @ a.T``. torch's ``x @ w`` (x [M, K], w [K, N]) is therefore ``mul_mat(wᵀ, x)``: a weight
that reaches the product through ``t()``/``permute`` (as ``nn.Linear``'s does after ATen's
decomposition) is read as stored, any other right-hand side is transposed and copied first.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ..core.tensor import Tensor
from .graph import Builder
from .layout import shape_of, tiles, val
from .table import CheckFn, Val, args_of, kw_of, register

aten = torch.ops.aten


def _rhs(b: Builder, y: Val) -> Tensor:
    """The ggml ``a`` operand (ne [K, N, ...]) of a product by torch ``y`` ([..., K, N])."""
    src = b.transposed_of.get(id(y.t))
    if src is not None:
        return src
    if y.ndim == 1:
        return b.contig(y.t)
    return b.ctx.cont(b.ctx.permute(y.t, 1, 0, 2, 3))


def _lhs(b: Builder, x: Val) -> Tensor:
    return x.t if x.t.is_contiguous() else b.ctx.cont(x.t)


def _product(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    out = b.ctx.mul_mat(_rhs(b, y), _lhs(b, x))
    return b.reshape(out, shape_of(node))


def _ranks(*ndims: int) -> CheckFn:
    def check(node: fx.Node) -> str | None:
        got = tuple(val(a).dim() for a in args_of(node)[:len(ndims)] if isinstance(a, fx.Node))
        return None if got == ndims else f"operands of {got} dims (this lowering takes {ndims})"
    return check


@register(aten.mm.default, notes="ggml_mul_mat", check=_ranks(2, 2))
def _mm(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    return _product(b, node, x, y)


def _addmm_check(node: fx.Node) -> str | None:
    """A bias of 1 or 2 dims, two matrices."""
    one = _ranks(1, 2, 2)(node)
    return None if one is None else _ranks(2, 2, 2)(node)


@register(aten.addmm.default, notes="ggml_mul_mat + ggml_add (beta, alpha: ggml_scale)", check=_addmm_check)
def _addmm(b: Builder, node: fx.Node, bias: Val, x: Val, y: Val, beta: float = 1, alpha: float = 1) -> Tensor:
    p = _product(b, node, x, y)
    if alpha != 1:
        p = b.ctx.scale(p, float(alpha))
    c = bias.t if beta == 1 else b.ctx.scale(b.contig(bias.t), float(beta))
    return b.ctx.add(p, c) if tiles(bias.shape, shape_of(node)) else b.ctx.add(b.expand(Val(c, bias.shape), shape_of(node)), p)


@register(aten.bmm.default, notes="ggml_mul_mat over the batch", check=_ranks(3, 3))
def _bmm(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    return _product(b, node, x, y)


def _matmul_check(node: fx.Node) -> str | None:
    x, y = val(args_of(node)[0]), val(args_of(node)[1])
    if x.dim() < 2 or y.dim() < 2:
        return "a vector operand"
    xb, yb = tuple(x.shape[:-2]), tuple(y.shape[:-2])
    if yb and (len(yb) > len(xb) or any(a % c for a, c in zip(xb[::-1], yb[::-1]))):
        return "batch dims of the right operand that do not tile the left one's"
    return None


@register(aten.matmul.default, notes="ggml_mul_mat (the right operand's batch dims tiled)", check=_matmul_check)
def _matmul(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    return _product(b, node, x, y)


def _linear_check(node: fx.Node) -> str | None:
    return None if val(args_of(node)[1]).dim() == 2 else "a weight of other than 2 dims"


@register(aten.linear.default, notes="ggml_mul_mat (the weight as stored) + ggml_add", check=_linear_check)
def _linear(b: Builder, node: fx.Node, x: Val, w: Val, bias: Val | None = None) -> Tensor:
    out = b.reshape(b.ctx.mul_mat(b.contig(w.t), _lhs(b, x)), shape_of(node))
    return out if bias is None else b.ctx.add(out, bias.t)


@register(aten.baddbmm.default, notes="ggml_mul_mat + ggml_add", check=_ranks(3, 3, 3))
def _baddbmm(b: Builder, node: fx.Node, c: Val, x: Val, y: Val, beta: float = 1, alpha: float = 1) -> Tensor:
    p = _product(b, node, x, y)
    if alpha != 1:
        p = b.ctx.scale(p, float(alpha))
    if beta == 0:
        return p
    add = b.expand(c, shape_of(node))
    if beta != 1:
        add = b.ctx.scale(b.contig(add), float(beta))
    return b.ctx.add(p, add)


@register(aten.mv.default, notes="ggml_mul_mat", check=_ranks(2, 1))
def _mv(b: Builder, node: fx.Node, m: Val, v: Val) -> Tensor:
    return b.reshape(b.ctx.mul_mat(b.contig(m.t), b.contig(v.t)), shape_of(node))


@register(aten.dot.default, notes="ggml_mul_mat", check=_ranks(1, 1))
def _dot(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    return b.reshape(b.ctx.mul_mat(b.contig(x.t), b.contig(y.t)), shape_of(node))
