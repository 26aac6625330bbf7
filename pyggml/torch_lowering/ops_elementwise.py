"""Element-wise ATen ops: arithmetic with NumPy broadcasting, activations, clamps, powers.

ggml's binary ops tile their second operand over the first (each ``a.ne[i]`` a multiple of
``b.ne[i]``); torch broadcasts both ways: the first operand is repeated to the result's shape
first where it is smaller. A Python number operand becomes a 1-element constant (tiles anything)
or, for products, ``ggml_scale``.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx

from ..core.tensor import Tensor
from .graph import Builder
from .layout import INDEX_DTYPES, shape_of, tiles, val
from .ops_shape import views_along
from .table import CheckFn, Val, args_of, int_bound, kw_of, register

aten = torch.ops.aten
_NUM = (int, float)


def _num_ok(i: int) -> CheckFn:
    def check(node: fx.Node) -> str | None:
        x = args_of(node)[i] if len(args_of(node)) > i else None
        if isinstance(x, bool) or (x is not None and not isinstance(x, (fx.Node,) + _NUM)):
            return f"argument {i} is {type(x).__name__}"
        return None
    return check


def _first(b: Builder, node: fx.Node, x: Val) -> Tensor:
    """x repeated to the node's shape where smaller, contiguous (ggml's first operand)."""
    return b.contig(b.expand(x, shape_of(node)))


def _scalar(b: Builder, node: fx.Node, x: Any, c: float, op: str) -> Tensor:
    t = _first(b, node, x)
    if op == "mul":
        return b.ctx.scale(t, c)
    if op == "div":
        return b.ctx.scale(t, 1.0 / c) if c != 0 else b.ctx.div(t, b.constant([c]))
    return b.op(op)(t, b.constant([c]))


def binary(b: Builder, node: fx.Node, x: Any, y: Any, op: str) -> Tensor:
    """``x op y`` (``op``: a ggml binary op's name, ``"add"``...) broadcast to ``node``'s shape:
    Vals or Python numbers."""
    if isinstance(y, _NUM):
        return _scalar(b, node, x, float(y), op)
    if isinstance(x, _NUM):   # number op tensor: the tensor broadcast to the result, the number first
        full = b.constant(float(x))
        t = b.contig(b.expand(y, shape_of(node)))
        like = b.ctx.repeat(full, t)
        return b.op(op)(like, t)
    if op in ("add", "mul") and x.shape != y.shape and tuple(y.shape) == shape_of(node):
        return b.op(op)(b.contig(y.t), x.t)   # x broadcast by ggml's tiling: no repeat
    return b.op(op)(_first(b, node, x), y.t)


_BIN_NOTES = "ggml_{} (ggml_repeat first where the first operand is broadcast; a number: a constant or ggml_scale)"
_INT_NOTES = ("; integers in float32 (ggml_cast), where their bound (inputs checked at each call, constants) "
              "proves it exact")


def _sum_check(node: fx.Node) -> str | None:
    """add, sub and mul: numbers as the second operand; integer results only of small integers
    (:func:`~pyggml.torch_lowering.table.int_bound`), float ones only of floats."""
    why = _num_ok(1)(node)
    if why is not None:
        return why
    a = args_of(node)
    operands = [x for x in a[:2] if isinstance(x, fx.Node)]
    if any(val(x).dtype == torch.bool for x in operands) or val(node).dtype == torch.bool:
        return "a bool operand"
    if val(node).dtype not in INDEX_DTYPES:
        ints = [x for x in operands if val(x).dtype in INDEX_DTYPES]
        return f"an integer operand ({ints[0]}) of a {val(node).dtype} result" if ints else None
    alpha = kw_of(node).get("alpha", a[2] if len(a) > 2 else 1)
    if alpha != 1:
        return f"an integer sum with alpha {alpha}"
    return int_bound(node)[2]


def _in_f32(b: Builder, node: fx.Node, x: Any, y: Any, op: str) -> Tensor:
    """Integers (proven small: exact) ``x op y`` in float32, back to I32."""
    return b.as_i32(binary(b, node, b.as_f32(x), b.as_f32(y), op))


def _sum(b: Builder, node: fx.Node, x: Any, y: Any, alpha: float, op: str) -> Tensor:
    if val(node).dtype in INDEX_DTYPES:   # small integers: exact in float32
        return _in_f32(b, node, x, y, op)
    if alpha != 1:
        y = y * alpha if isinstance(y, _NUM) else Val(b.ctx.scale(b.contig(y.t), float(alpha)), y.shape)
    return binary(b, node, x, y, op)


@register(aten.add.Tensor, aten.add.Scalar, notes=_BIN_NOTES.format("add") + _INT_NOTES, check=_sum_check,
          int_results=True, makes_values=True)
def _add(b: Builder, node: fx.Node, x: Any, y: Any, alpha: float = 1) -> Tensor:
    return _sum(b, node, x, y, alpha, "add")


@register(aten.sub.Tensor, aten.sub.Scalar, notes=_BIN_NOTES.format("sub") + _INT_NOTES, check=_sum_check,
          int_results=True, makes_values=True)
def _sub(b: Builder, node: fx.Node, x: Any, y: Any, alpha: float = 1) -> Tensor:
    return _sum(b, node, x, y, alpha, "sub")


@register(aten.rsub.Scalar, aten.rsub.Tensor, notes="ggml_sub with the operands swapped", check=_num_ok(1))
def _rsub(b: Builder, node: fx.Node, x: Any, y: Any, alpha: float = 1) -> Tensor:
    if alpha != 1:
        x = Val(b.ctx.scale(b.contig(x.t), float(alpha)), x.shape)
    return binary(b, node, y, x, "sub")


@register(aten.mul.Tensor, aten.mul.Scalar, notes=_BIN_NOTES.format("mul") + _INT_NOTES, check=_sum_check,
          int_results=True, makes_values=True)
def _mul(b: Builder, node: fx.Node, x: Any, y: Any) -> Tensor:
    if isinstance(x, _NUM):
        x, y = y, x
    if val(node).dtype in INDEX_DTYPES:
        return _in_f32(b, node, x, y, "mul")
    return binary(b, node, x, y, "mul")


def _div_check(node: fx.Node) -> str | None:
    if kw_of(node).get("rounding_mode") is not None:
        return "a rounding mode"
    return _num_ok(1)(node)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, notes=_BIN_NOTES.format("div"), check=_div_check)
def _div(b: Builder, node: fx.Node, x: Any, y: Any, rounding_mode: Any = None) -> Tensor:
    return binary(b, node, x, y, "div")


# ---------------------------------------------------------------------- unary
def _unary(name: str, *targets: Any, notes: str | None = None) -> None:
    def lower(b: Builder, node: fx.Node, x: Val) -> Tensor:
        return b.op(name)(b.contig(x.t))
    register(*targets, notes=notes or f"ggml_{name}")(lower)


_unary("neg", aten.neg.default)
_unary("abs", aten.abs.default)
_unary("exp", aten.exp.default)
_unary("log", aten.log.default)
_unary("sqrt", aten.sqrt.default)
_unary("sin", aten.sin.default)
_unary("cos", aten.cos.default)
_unary("tanh", aten.tanh.default)
_unary("sigmoid", aten.sigmoid.default)
_unary("relu", aten.relu.default)
_unary("silu", aten.silu.default)
_unary("sgn", aten.sign.default, aten.sgn.default, notes="ggml_sgn")
_unary("floor", aten.floor.default)
_unary("ceil", aten.ceil.default)
_unary("trunc", aten.trunc.default)
_unary("expm1", aten.expm1.default)
_unary("hardswish", aten.hardswish.default)
_unary("hardsigmoid", aten.hardsigmoid.default)
_unary("sqr", aten.square.default, notes="ggml_sqr")


def _gelu_check(node: fx.Node) -> str | None:
    return None if kw_of(node).get("approximate", "none") in ("none", "tanh") else "an unknown approximation"


@register(aten.gelu.default, notes="ggml_gelu_erf (approximate='none'); 'tanh': x/2·(1 + ggml_tanh(√(2/π)·(x + "
          "0.044715·x³))) in float32 ops (ggml_gelu's CPU kernel reads an F16 table: 1e-3 off)", check=_gelu_check)
def _gelu(b: Builder, node: fx.Node, x: Val, approximate: str = "none") -> Tensor:
    t, ctx = b.contig(x.t), b.ctx
    if approximate == "none":
        return ctx.gelu_erf(t)
    inner = ctx.scale(ctx.add(t, ctx.scale(ctx.mul(ctx.sqr(t), t), 0.044715)), math.sqrt(2.0 / math.pi))
    return ctx.mul(ctx.scale(t, 0.5), ctx.add(ctx.tanh(inner), b.constant(1.0)))


def _elu_check(node: fx.Node) -> str | None:
    alpha, scale, in_scale = (list(args_of(node)[1:4]) + [1, 1, 1])[:3]
    return None if (alpha, scale, in_scale) == (1, 1, 1) else "alpha, scale or input_scale other than 1"


@register(aten.elu.default, notes="ggml_elu (alpha 1)", check=_elu_check)
def _elu(b: Builder, node: fx.Node, x: Val, *rest: Any) -> Tensor:
    return b.ctx.elu(b.contig(x.t))


@register(aten.leaky_relu.default, notes="ggml_leaky_relu")
def _leaky_relu(b: Builder, node: fx.Node, x: Val, negative_slope: float = 0.01) -> Tensor:
    return b.ctx.leaky_relu(b.contig(x.t), float(negative_slope))


def _softplus_check(node: fx.Node) -> str | None:
    beta, threshold = (list(args_of(node)[1:3]) + [1, 20])[:2]
    return None if (beta, threshold) == (1, 20) else "beta or threshold other than 1, 20"


@register(aten.softplus.default, notes="ggml_softplus (beta 1, threshold 20)", check=_softplus_check)
def _softplus(b: Builder, node: fx.Node, x: Val, *rest: Any) -> Tensor:
    return b.ctx.softplus(b.contig(x.t))


def _bound(v: Any) -> float | None:
    return None if v is None else float(v)


def _clamp_check(node: fx.Node) -> str | None:
    return None if all(not isinstance(a, fx.Node) for a in args_of(node)[1:]) else "tensor bounds"


@register(aten.clamp.default, aten.hardtanh.default, notes="ggml_clamp", check=_clamp_check)
def _clamp(b: Builder, node: fx.Node, x: Val, lo: Any = None, hi: Any = None) -> Tensor:
    if node.target == aten.hardtanh.default:
        lo, hi = (-1.0 if lo is None else lo), (1.0 if hi is None else hi)
    low, high = _bound(lo), _bound(hi)
    return b.ctx.clamp(b.contig(x.t), -math.inf if low is None else low, math.inf if high is None else high)


@register(aten.clamp_min.default, notes="ggml_clamp", check=_clamp_check)
def _clamp_min(b: Builder, node: fx.Node, x: Val, lo: float) -> Tensor:
    return b.ctx.clamp(b.contig(x.t), float(lo), math.inf)


@register(aten.clamp_max.default, notes="ggml_clamp", check=_clamp_check)
def _clamp_max(b: Builder, node: fx.Node, x: Val, hi: float) -> Tensor:
    return b.ctx.clamp(b.contig(x.t), -math.inf, float(hi))


@register(aten.rsqrt.default, notes="ggml_exp(ggml_scale(ggml_log(x), -0.5))")
def _rsqrt(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.exp(b.ctx.scale(b.ctx.log(b.contig(x.t)), -0.5))


@register(aten.reciprocal.default, notes="ggml_div of a constant 1 tiled to x")
def _reciprocal(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.div(b.ctx.repeat(b.constant(1.0), t), t)


_POWERS = (0.5, -0.5, -1, 1, 2, 3, 4)


def _pow_check(node: fx.Node) -> str | None:
    e = args_of(node)[1]
    return None if isinstance(e, _NUM) and not isinstance(e, bool) and e in _POWERS else f"exponent {e!r}"


@register(aten.pow.Tensor_Scalar, notes="ggml_sqr, ggml_sqrt, products and ggml_div (exponents 0.5, -0.5, -1..4)",
          check=_pow_check)
def _pow(b: Builder, node: fx.Node, x: Val, e: float) -> Tensor:
    t = b.contig(x.t)
    ctx = b.ctx
    if e == 0.5:
        return ctx.sqrt(t)
    if e == -0.5:
        return ctx.exp(ctx.scale(ctx.log(t), -0.5))
    if e == -1:
        return ctx.div(ctx.repeat(b.constant(1.0), t), t)
    if e == 1:
        return ctx.scale(t, 1.0)
    sq = ctx.sqr(t)
    return sq if e == 2 else ctx.mul(sq, t) if e == 3 else ctx.sqr(sq)


# ---------------------------------------------------------------------- composites of ggml ops
@register(aten.maximum.default, notes="a + ggml_relu(b - a)")
def _maximum(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    a = _first(b, node, x)
    return b.ctx.add(a, b.ctx.relu(b.ctx.sub(b.contig(b.expand(y, shape_of(node))), a)))


@register(aten.minimum.default, notes="a - ggml_relu(a - b)")
def _minimum(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    a = _first(b, node, x)
    return b.ctx.sub(a, b.ctx.relu(b.ctx.sub(a, b.contig(b.expand(y, shape_of(node))))))


def _addc(b: Builder, node: fx.Node, x: Val, t1: Val, t2: Val, value: float, op: str) -> Tensor:
    """x + value · (t1 op t2), every operand broadcast to the result."""
    shape = shape_of(node)
    p = b.op(op)(b.contig(b.expand(t1, shape)), b.contig(b.expand(t2, shape)))
    if value != 1:
        p = b.ctx.scale(p, float(value))
    return b.ctx.add(p, x.t) if tiles(x.shape, shape) else b.ctx.add(b.contig(b.expand(x, shape)), p)


@register(aten.addcmul.default, notes="ggml_mul + ggml_scale + ggml_add")
def _addcmul(b: Builder, node: fx.Node, x: Val, t1: Val, t2: Val, value: float = 1) -> Tensor:
    return _addc(b, node, x, t1, t2, value, "mul")


@register(aten.addcdiv.default, notes="ggml_div + ggml_scale + ggml_add")
def _addcdiv(b: Builder, node: fx.Node, x: Val, t1: Val, t2: Val, value: float = 1) -> Tensor:
    return _addc(b, node, x, t1, t2, value, "div")


@register(aten.lerp.Scalar, notes="a + w·(b - a): ggml_sub, ggml_scale, ggml_add")
def _lerp(b: Builder, node: fx.Node, x: Val, y: Val, w: float) -> Tensor:
    shape = shape_of(node)
    a = b.contig(b.expand(x, shape))
    return b.ctx.add(a, b.ctx.scale(b.ctx.sub(b.contig(b.expand(y, shape)), a), float(w)))


@register(aten.log1p.default, notes="ggml_log(1 + x)")
def _log1p(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.log(b.ctx.add(b.contig(x.t), b.constant(1.0)))


@register(aten.log2.default, notes="ggml_log, ggml_scale by 1/ln 2")
def _log2(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.scale(b.ctx.log(b.contig(x.t)), 1.0 / math.log(2.0))


@register(aten.exp2.default, notes="ggml_exp of ggml_scale by ln 2")
def _exp2(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.exp(b.ctx.scale(b.contig(x.t), math.log(2.0)))


@register(aten.mish.default, notes="x·tanh(softplus(x)): ggml_softplus, ggml_tanh, ggml_mul")
def _mish(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.mul(t, b.ctx.tanh(b.ctx.softplus(t)))


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805


@register(aten.selu.default, notes="λ·relu(x) + λα·expm1(-relu(-x))")
def _selu(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t, ctx = b.contig(x.t), b.ctx
    neg = ctx.neg(ctx.relu(ctx.neg(t)))
    return ctx.add(ctx.scale(ctx.relu(t), _SELU_SCALE), ctx.scale(ctx.expm1(neg), _SELU_SCALE * _SELU_ALPHA))


@register(aten.tan.default, notes="ggml_sin / ggml_cos")
def _tan(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.div(b.ctx.sin(t), b.ctx.cos(t))


@register(aten.logit.default, notes="ggml_log(x / (1 - x))",
          check=lambda node: None if len(args_of(node)) < 2 and kw_of(node).get("eps") is None else "eps")
def _logit(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    one_minus = b.ctx.sub(b.ctx.repeat(b.constant(1.0), t), t)
    return b.ctx.log(b.ctx.div(t, one_minus))


@register(aten.sinh.default, notes="(exp(x) - exp(-x)) / 2")
def _sinh(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.scale(b.ctx.sub(b.ctx.exp(t), b.ctx.exp(b.ctx.neg(t))), 0.5)


@register(aten.cosh.default, notes="(exp(x) + exp(-x)) / 2")
def _cosh(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.scale(b.ctx.add(b.ctx.exp(t), b.ctx.exp(b.ctx.neg(t))), 0.5)


@register(aten.frac.default, notes="x - ggml_trunc(x)")
def _frac(b: Builder, node: fx.Node, x: Val) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.sub(t, b.ctx.trunc(t))


@register(aten.glu.default, notes="the first half times ggml_sigmoid of the second (views, ggml_mul)")
def _glu(b: Builder, node: fx.Node, x: Val, dim: int = -1) -> Tensor:
    half = x.shape[dim] // 2
    a, g = views_along(b, x, dim, [half, half])
    return b.ctx.mul(b.ctx.cont(a), b.ctx.sigmoid(b.ctx.cont(g)))


@register(aten.log10.default, notes="ggml_log, ggml_scale by 1/ln 10")
def _log10(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.scale(b.ctx.log(b.contig(x.t)), 1.0 / math.log(10.0))


@register(aten.celu.default, notes="α·elu(x/α): ggml_scale, ggml_elu, ggml_scale",
          check=lambda node: None if float(args_of(node)[1] if len(args_of(node)) > 1 else kw_of(node).get("alpha", 1.0))
          != 0 else "alpha 0")
def _celu(b: Builder, node: fx.Node, x: Val, alpha: float = 1.0) -> Tensor:
    a = float(alpha)
    return b.ctx.scale(b.ctx.elu(b.ctx.scale(b.contig(x.t), 1.0 / a)), a)


def _pow_scalar_check(node: fx.Node) -> str | None:
    base = args_of(node)[0]
    return None if isinstance(base, _NUM) and not isinstance(base, bool) and base > 0 else \
        "a base that is not a positive number"


@register(aten.pow.Scalar, notes="ggml_exp of ggml_scale by ln(base) (a positive base)", check=_pow_scalar_check)
def _pow_scalar(b: Builder, node: fx.Node, base: float, x: Val) -> Tensor:
    return b.ctx.exp(b.ctx.scale(b.contig(x.t), math.log(float(base))))


@register(aten.lerp.Tensor, notes="a + w·(b - a): ggml_sub, ggml_mul, ggml_add")
def _lerp_tensor(b: Builder, node: fx.Node, x: Val, y: Val, w: Val) -> Tensor:
    shape = shape_of(node)
    a = b.contig(b.expand(x, shape))
    d = b.ctx.sub(b.contig(b.expand(y, shape)), a)
    return b.ctx.add(a, b.ctx.mul(d, b.contig(b.expand(w, shape))))


@register(aten.hypot.default, notes="ggml_sqrt(x² + y²)")
def _hypot(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    shape = shape_of(node)
    return b.ctx.sqrt(b.ctx.add(b.ctx.sqr(b.contig(b.expand(x, shape))), b.ctx.sqr(b.contig(b.expand(y, shape)))))


@register(aten.logaddexp.default, notes="m + log(exp(x - m) + exp(y - m)), m = max(x, y)")
def _logaddexp(b: Builder, node: fx.Node, x: Val, y: Val) -> Tensor:
    shape, ctx = shape_of(node), b.ctx
    a, c = b.contig(b.expand(x, shape)), b.contig(b.expand(y, shape))
    m = ctx.add(a, ctx.relu(ctx.sub(c, a)))
    return ctx.add(m, ctx.log(ctx.add(ctx.exp(ctx.sub(a, m)), ctx.exp(ctx.sub(c, m)))))


@register(aten.deg2rad.default, notes="ggml_scale by π/180")
def _deg2rad(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.scale(b.contig(x.t), math.pi / 180.0)


@register(aten.rad2deg.default, notes="ggml_scale by 180/π")
def _rad2deg(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.scale(b.contig(x.t), 180.0 / math.pi)


@register(aten.relu6.default, notes="ggml_clamp to [0, 6]")
def _relu6(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.ctx.clamp(b.contig(x.t), 0.0, 6.0)


def _prelu_check(node: fx.Node) -> str | None:
    x, w = (val(a) for a in args_of(node)[:2])
    if w.numel() != 1 and (x.dim() < 2 or w.dim() != 1 or w.shape[0] != x.shape[1]):
        return "a weight that is neither one number nor one per channel (dim 1)"
    return None


@register(aten.prelu.default, notes="relu(x) - w·relu(-x), w per channel (dim 1) or one", check=_prelu_check)
def _prelu(b: Builder, node: fx.Node, x: Val, w: Val) -> Tensor:
    ctx, t = b.ctx, b.contig(x.t)
    n_w = 1
    for d in w.shape:
        n_w *= d
    shape = (1,) * x.ndim if n_w == 1 else (x.shape[1],) + (1,) * (x.ndim - 2)
    neg = ctx.mul(ctx.relu(ctx.neg(t)), b.reshape(b.contig(w.t), shape))
    return ctx.sub(ctx.relu(t), neg)


def _clamp_tensor_check(node: fx.Node) -> str | None:
    args = args_of(node)
    bounds = [a for a in args[1:3] if a is not None]
    return None if bounds and all(isinstance(a, fx.Node) for a in bounds) else "no tensor bound"


@register(aten.clamp.Tensor, notes="max then min with the bounds: a + relu(lo - a), a - relu(a - hi)",
          check=_clamp_tensor_check)
def _clamp_tensor(b: Builder, node: fx.Node, x: Val, lo: Val | None = None, hi: Val | None = None) -> Tensor:
    shape, ctx = shape_of(node), b.ctx
    a = b.contig(b.expand(x, shape))
    if lo is not None:
        a = ctx.add(a, ctx.relu(ctx.sub(b.contig(b.expand(lo, shape)), a)))
    if hi is not None:
        a = ctx.sub(a, ctx.relu(ctx.sub(a, b.contig(b.expand(hi, shape)))))
    return a


def _log_sigmoid_check(node: fx.Node) -> str | None:
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "its buffer is used (only the output is lowered)"
    return None


@register(aten.log_sigmoid_forward.default, notes="-softplus(-x): ggml_neg, ggml_softplus, ggml_neg (the output)",
          check=_log_sigmoid_check)
def _log_sigmoid(b: Builder, node: fx.Node, x: Val) -> Any:
    ctx = b.ctx
    return (ctx.neg(ctx.softplus(ctx.neg(b.contig(x.t)))), None)


@register(aten.fill.Tensor, notes="the 0-dim value broadcast to x (ggml_repeat)",
          check=lambda node: None if val(args_of(node)[1]).dim() == 0 else "a value of more than 0 dims")
def _fill_tensor(b: Builder, node: fx.Node, x: Val, value: Val) -> Tensor:
    return b.expand(value, shape_of(node))


# ---------------------------------------------------------------------- shrinkage and steps
def _lambd(node: fx.Node) -> float:
    a = args_of(node)
    return float(a[1] if len(a) > 1 else kw_of(node).get("lambd", 0.5))


def _lambd_check(node: fx.Node) -> str | None:
    return None if _lambd(node) >= 0 else "a negative lambd (torch refuses it)"


@register(aten.softshrink.default, notes="x - ggml_clamp(x, -lambd, lambd)", check=_lambd_check)
def _softshrink(b: Builder, node: fx.Node, x: Val, lambd: float = 0.5) -> Tensor:
    t, low = b.contig(x.t), _lambd(node)
    return b.ctx.sub(t, b.ctx.clamp(t, -low, low))


@register(aten.hardshrink.default, notes="x · ggml_step(ggml_abs(x) - lambd)", check=_lambd_check)
def _hardshrink(b: Builder, node: fx.Node, x: Val, lambd: float = 0.5) -> Tensor:
    t = b.contig(x.t)
    return b.ctx.mul(t, b.ctx.step(b.ctx.sub(b.ctx.abs(t), b.constant(_lambd(node)))))


@register(aten.threshold.default, notes="x · s + value · (1 - s), s = ggml_step(x - threshold)", check=_num_ok(1))
def _threshold(b: Builder, node: fx.Node, x: Val, threshold: float, value: float) -> Tensor:
    t, ctx = b.contig(x.t), b.ctx
    s = ctx.step(ctx.sub(t, b.constant(float(threshold))))
    return ctx.add(ctx.mul(t, s), ctx.add(ctx.scale(s, -float(value)), b.constant(float(value))))


@register(aten.heaviside.default, notes="ggml_step(x) + (1 - ggml_step(x) - ggml_step(-x)) · values")
def _heaviside(b: Builder, node: fx.Node, x: Val, values: Val) -> Tensor:
    ctx, shape = b.ctx, shape_of(node)
    t = b.contig(b.expand(x, shape))
    up, down = ctx.step(t), ctx.step(ctx.neg(t))
    zero = ctx.sub(ctx.sub(ctx.repeat(b.constant(1.0), t), up), down)          # 1 where x == 0
    return ctx.add(up, ctx.mul(zero, b.contig(b.expand(values, shape))))


register(aten.clamp_min.Tensor, notes="a + ggml_relu(b - a) (maximum)")(_maximum)
register(aten.clamp_max.Tensor, notes="a - ggml_relu(a - b) (minimum)")(_minimum)


# ---------------------------------------------------------------------- where
def _number_of(x: Any) -> float | None:
    """The number a ``where`` branch holds: a Python number, or a ``scalar_tensor`` node's."""
    if isinstance(x, _NUM) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, fx.Node) and x.target == aten.scalar_tensor.default and isinstance(x.args[0], _NUM) \
            and not isinstance(x.args[0], bool):
        return float(x.args[0])
    return None


def _where_check(node: fx.Node) -> str | None:
    cond, x, y = args_of(node)[:3]
    if not isinstance(cond, fx.Node) or val(cond).dtype != torch.bool:
        return "a condition that is not a bool tensor"
    if _number_of(x) is None or _number_of(y) is None:
        return "a tensor branch (ggml takes two numbers: scalar_tensor or Python numbers)"
    if val(node).dtype != torch.float32:
        return f"its result: dtype {val(node).dtype}"
    if tuple(val(cond).shape) != shape_of(node):
        return "a condition broadcast to the result"
    return None


@register(aten.where.self, notes="two numbers picked by a bool condition: ggml_get_rows of a 2-row table at the "
          "condition cast to I32 (exact for any values, infinities too)", check=_where_check, mask_args=(0,))
def _where(b: Builder, node: fx.Node, cond: Val, x: Any, y: Any) -> Tensor:
    args = args_of(node)
    table = b.constant([[_number_of(args[2])], [_number_of(args[1])]])   # row 0: False, row 1: True
    ctx, n = b.ctx, math.prod(shape_of(node))
    picks = ctx.cast(b.reshape(cond.t, [n]), "i32")                      # the bool as F32 0/1 -> I32
    return b.reshape(ctx.get_rows(table, picks), shape_of(node))
