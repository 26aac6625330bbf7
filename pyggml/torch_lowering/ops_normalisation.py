"""Reductions, normalisation and softmax: sum, mean, layer norm, RMS norm, softmax, log-softmax.

ggml reduces and normalises along ``ne[0]``, torch's last dim; another dim is permuted there
first (and back).
"""
from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import torch
from torch import fx

from ..core.tensor import Tensor
from .graph import Builder
from .layout import INDEX_DTYPES, axis_of, shape_of, val
from .table import Val, args_of, int_bound, kw_of, register

aten = torch.ops.aten


def _to_front(b: Builder, x: Val, dim: int) -> tuple[Tensor, list[int]]:
    """x with torch dim ``dim`` moved to ggml axis 0 (contiguous), and the axes to move it back."""
    ax = axis_of(dim, x.ndim)
    if ax == 0:
        return b.contig(x.t), [0, 1, 2, 3]
    axes = [0, 1, 2, 3]
    axes[0], axes[ax] = ax, 0          # swap ggml axes 0 and ax
    return b.ctx.cont(b.ctx.permute(x.t, *axes)), axes


def _reduce(b: Builder, node: fx.Node, x: Val, dims: Any, keepdim: bool, mean: bool) -> Tensor:
    n = x.ndim
    dl = list(range(n)) if not dims and dims != 0 else ([dims] if isinstance(dims, int) else list(dims))
    return b.reshape(_reduce_to(b, x, [d % n for d in dl], mean), shape_of(node))


def _sum_check(node: fx.Node) -> str | None:
    return None if kw_of(node).get("dtype") is None else "a dtype"


@register(aten.sum.dim_IntList, notes="ggml_sum_rows (the dim permuted to ne[0] first)", check=_sum_check)
def _sum(b: Builder, node: fx.Node, x: Val, dims: Any = None, keepdim: bool = False, **kw: Any) -> Tensor:
    return _reduce(b, node, x, dims, keepdim, mean=False)


@register(aten.sum.default, notes="ggml_sum", check=_sum_check)
def _sum_all(b: Builder, node: fx.Node, x: Val, **kw: Any) -> Tensor:
    return b.ctx.sum(b.contig(x.t))


@register(aten.mean.dim, notes="ggml_mean (the dim permuted to ne[0] first)", check=_sum_check)
def _mean(b: Builder, node: fx.Node, x: Val, dims: Any = None, keepdim: bool = False, **kw: Any) -> Tensor:
    return _reduce(b, node, x, dims, keepdim, mean=True)


@register(aten.mean.default, notes="ggml_sum + ggml_scale", check=_sum_check)
def _mean_all(b: Builder, node: fx.Node, x: Val, **kw: Any) -> Tensor:
    n = 1
    for d in x.shape:
        n *= d
    return b.ctx.scale(b.ctx.sum(b.contig(x.t)), 1.0 / n)


def _softmax_check(node: fx.Node) -> str | None:
    half = args_of(node)[2] if len(args_of(node)) > 2 else False
    return "half_to_float" if half is True else None


def _softmax_val(b: Builder, x: Val, dim: int, log: bool) -> Tensor:
    front, axes = _to_front(b, x, dim)
    s = b.ctx.soft_max(front)
    if log:
        s = b.ctx.log(s)
    return s if axes == [0, 1, 2, 3] else b.ctx.permute(s, *axes)


@register(aten._softmax.default, aten.softmax.int, notes="ggml_soft_max_ext (the dim permuted to ne[0] first)",
          check=_softmax_check)
def _softmax(b: Builder, node: fx.Node, x: Val, dim: int, half: Any = False) -> Tensor:
    return _softmax_val(b, x, dim, log=False)


@register(aten._log_softmax.default, aten.log_softmax.int, notes="ggml_log(ggml_soft_max_ext)", check=_softmax_check)
def _log_softmax(b: Builder, node: fx.Node, x: Val, dim: int, half: Any = False) -> Tensor:
    return _softmax_val(b, x, dim, log=True)


def _norm_check(node: fx.Node) -> str | None:
    shape = args_of(node)[1]
    if len(shape) != 1:
        return f"a normalized shape of {len(shape)} dims (ggml normalises one)"
    users = [u for u in node.users]
    if node.target == aten.native_layer_norm.default and any(
            u.target is not operator.getitem or u.args[1] != 0 for u in users):
        return "its mean or rstd is used (only the normalised output is lowered)"
    return None


def _layer_norm(b: Builder, node: fx.Node, x: Val, shape: Sequence[int], w: Val | None = None,
                bias: Val | None = None, eps: float = 1e-5, *rest: Any) -> Any:
    out = b.ctx.norm(b.contig(x.t), float(eps))
    if w is not None:
        out = b.ctx.mul(out, w.t)
    if bias is not None:
        out = b.ctx.add(out, bias.t)
    if node.target == aten.native_layer_norm.default:
        return (out, None, None)
    return out


register(aten.native_layer_norm.default, aten.layer_norm.default,
         notes="ggml_norm + ggml_mul + ggml_add (the normalised output)", check=_norm_check)(_layer_norm)


def _rms_check(node: fx.Node) -> str | None:
    shape = args_of(node)[1]
    eps = args_of(node)[3] if len(args_of(node)) > 3 else kw_of(node).get("eps")
    if len(shape) != 1:
        return f"a normalized shape of {len(shape)} dims"
    return None if eps is not None else "no eps (torch takes the dtype's machine epsilon)"


@register(aten.rms_norm.default, notes="ggml_rms_norm + ggml_mul", check=_rms_check)
def _rms_norm(b: Builder, node: fx.Node, x: Val, shape: Sequence[int], w: Val | None = None,
              eps: float | None = None) -> Tensor:
    out = b.ctx.rms_norm(b.contig(x.t), float(eps or 0.0))
    return out if w is None else b.ctx.mul(out, w.t)


@register(operator.getitem, notes="one result of a node with several (layer norm)")
def _getitem(b: Builder, node: fx.Node, results: Any, i: int) -> Tensor:
    got = results[i]
    return got.t if isinstance(got, Val) else got


def _var_check(node: fx.Node) -> str | None:
    corr = kw_of(node).get("correction", 1)
    return None if isinstance(corr, (int, float)) or corr is None else "a tensor correction"


def _var(b: Builder, node: fx.Node, x: Val, dims: Any = None, *, correction: Any = 1, keepdim: bool = False) -> Any:
    n = x.ndim
    dl = list(range(n)) if not dims else ([dims] if isinstance(dims, int) else [d % n for d in dims])
    count = 1
    for d in dl:
        count *= x.shape[d]
    mean = _reduce_to(b, x, dl, mean=True)
    dev = b.ctx.sub(b.contig(x.t), mean)
    ss = _reduce_to(b, Val(b.ctx.sqr(dev), x.shape), dl, mean=False)
    c = 1 if correction is None else correction
    var = b.ctx.scale(ss, 1.0 / max(count - c, 0) if count - c > 0 else math.inf)
    out_shape = shape_of(node) if not isinstance(node.meta["val"], (tuple, list)) else tuple(node.meta["val"][0].shape)
    var = b.reshape(var, out_shape)
    if node.target == aten.std.correction:
        return b.ctx.sqrt(var)
    if node.target == aten.var_mean.correction:
        return (var, b.reshape(mean, out_shape))
    if node.target == aten.std_mean.correction:
        return (b.ctx.sqrt(var), b.reshape(mean, out_shape))
    return var


def _reduce_to(b: Builder, x: Val, dims: list[int], mean: bool) -> Tensor:
    """x summed (or averaged) over torch dims ``dims``, kept as size 1, contiguous."""
    t, shape = x.t, list(x.shape)
    for d in sorted(set(dims)):
        front, axes = _to_front(b, Val(t, tuple(shape)), d)
        r = b.ctx.mean(front) if mean else b.ctx.sum_rows(front)
        # permuted back and copied: a size-1 dim swapped keeps ggml_is_contiguous true but
        # leaves strides that ggml_scale and others refuse
        t = b.ctx.cont(b.ctx.permute(r, *axes)) if axes != [0, 1, 2, 3] else r
        shape[d] = 1
    return b.contig(t)


register(aten.var.correction, aten.std.correction, aten.var_mean.correction, aten.std_mean.correction,
         notes="ggml_mean, ggml_sub, ggml_sqr, ggml_sum_rows, ggml_scale (ggml_sqrt for std)",
         check=_var_check)(_var)


def _cumsum_check(node: fx.Node) -> str | None:
    if kw_of(node).get("dtype") is not None:
        return "a dtype"
    if val(node).dtype in INDEX_DTYPES:   # of integers or bools: exact in float32 while small
        return int_bound(node)[2]
    return None if val(args_of(node)[0]).dtype not in INDEX_DTYPES else "an integer input to a float result"


@register(aten.cumsum.default, notes="ggml_cumsum (the dim permuted to ne[0] first); of integers or bools (at "
          "most 2^24 on the way) in float32, exact", check=_cumsum_check, int_results=True, makes_values=True)
def _cumsum(b: Builder, node: fx.Node, x: Val, dim: int, **kw: Any) -> Tensor:
    front, axes = _to_front(b, b.as_f32(x), dim)
    s = b.ctx.cumsum(front)
    s = s if axes == [0, 1, 2, 3] else b.ctx.permute(s, *axes)
    return b.as_i32(s) if val(node).dtype in INDEX_DTYPES else s


def _bn_check(node: fx.Node) -> str | None:
    return None if all(isinstance(a, fx.Node) for a in args_of(node)[1:5]) else "no running statistics or affine"


@register(aten._native_batch_norm_legit_no_training.default,
          notes="(x - mean) / sqrt(var + eps) · w + b per channel: ggml_sub, ggml_div, ggml_mul, ggml_add",
          check=_bn_check)
def _batch_norm(b: Builder, node: fx.Node, x: Val, w: Val, bias: Val, mean: Val, var: Val,
                momentum: float, eps: float) -> Any:
    ch = (x.shape[1],) + (1,) * (x.ndim - 2)    # per channel: torch dim 1
    ctx = b.ctx

    def per_channel(v: Val) -> Tensor:
        return b.reshape(v.t, ch)
    std = ctx.sqrt(ctx.add(b.contig(per_channel(var)), b.constant(float(eps))))
    out = ctx.div(ctx.sub(b.contig(x.t), per_channel(mean)), std)
    out = ctx.add(ctx.mul(out, per_channel(w)), per_channel(bias))
    return (out, None, None)


def _group_norm_check(node: fx.Node) -> str | None:
    x = val(args_of(node)[0])
    if node.target == aten.native_group_norm.default and any(
            u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "its mean or rstd is used (only the normalised output is lowered)"
    return None if 2 <= x.dim() <= 4 else f"a {x.dim()}-dim input"


def _group_norm_val(b: Builder, x: Val, groups: int, w: Val | None, bias: Val | None, eps: float) -> Tensor:
    """ggml_group_norm over x (N, C, *) seen as ggml ne [rest, 1, C, N]: groups of C / groups
    channels along ne[2]; then the per-channel affine."""
    n, c = x.shape[0], x.shape[1]
    rest = 1
    for d in x.shape[2:]:
        rest *= d
    t = b.ctx.reshape(b.contig(x.t), rest, 1, c, n)
    out = b.ctx.group_norm(t, int(groups), float(eps))
    if w is not None:
        out = b.ctx.mul(out, b.ctx.reshape(b.contig(w.t), 1, 1, c, 1))
    if bias is not None:
        out = b.ctx.add(out, b.ctx.reshape(b.contig(bias.t), 1, 1, c, 1))
    return b.reshape(out, x.shape)


@register(aten.native_group_norm.default, notes="ggml_group_norm + ggml_mul + ggml_add (the normalised output)",
          check=_group_norm_check)
def _native_group_norm(b: Builder, node: fx.Node, x: Val, w: Val | None, bias: Val | None, n: int, c: int,
                       hw: int, groups: int, eps: float) -> Any:
    return (_group_norm_val(b, x, groups, w, bias, eps), None, None)


@register(aten.group_norm.default, notes="ggml_group_norm + ggml_mul + ggml_add", check=_group_norm_check)
def _group_norm(b: Builder, node: fx.Node, x: Val, groups: int, w: Val | None = None, bias: Val | None = None,
                eps: float = 1e-5, *rest: Any) -> Tensor:
    return _group_norm_val(b, x, groups, w, bias, eps)


def _vector_norm_check(node: fx.Node) -> str | None:
    args, kw = args_of(node), kw_of(node)
    order = args[1] if len(args) > 1 else kw.get("ord", 2)
    dtype = args[4] if len(args) > 4 else kw.get("dtype")
    if order not in (2, 2.0):
        return f"ord={order} (2 only)"
    return None if dtype is None else "a dtype"


@register(aten.linalg_vector_norm.default, notes="ggml_sqrt of ggml_sum_rows of ggml_sqr (ord 2)",
          check=_vector_norm_check)
def _vector_norm(b: Builder, node: fx.Node, x: Val, order: float = 2, dims: Any = None, keepdim: bool = False,
                 **kw: Any) -> Tensor:
    n = x.ndim
    dl = list(range(n)) if dims is None or (not isinstance(dims, int) and not dims) else \
        ([dims % n] if isinstance(dims, int) else [d % n for d in dims])
    sq = Val(b.ctx.sqr(b.contig(x.t)), x.shape)
    return b.reshape(b.ctx.sqrt(_reduce_to(b, sq, dl, mean=False)), shape_of(node))


# ---------------------------------------------------------------------- largest and smallest
def _extreme(b: Builder, x: Val, dims: Any, smallest: bool) -> Tensor:
    """The largest (or smallest) of x over torch dims ``dims`` (all when empty or None), kept as
    size 1, contiguous: one ``ggml_pool_1d`` max over whole rows per dim (the smallest: of -x,
    negated back)."""
    n = x.ndim
    dl = list(range(n)) if dims is None or dims == [] else ([dims] if isinstance(dims, int) else list(dims))
    t, shape = (b.ctx.neg(b.contig(x.t)) if smallest else x.t), list(x.shape)
    for d in sorted({d % n for d in dl}):
        front, axes = _to_front(b, Val(t, tuple(shape)), d)
        r = b.ctx.pool_1d(front, "max", front.ne[0], front.ne[0])
        t = b.ctx.cont(b.ctx.permute(r, *axes)) if axes != [0, 1, 2, 3] else r
        shape[d] = 1
    t = b.contig(t)
    return b.ctx.neg(t) if smallest else t


def _extreme_check(node: fx.Node) -> str | None:
    x = val(args_of(node)[0])
    return None if x.dim() > 0 else "a 0-dim tensor"


@register(aten.amax.default, aten.amin.default, notes="ggml_pool_1d max over each reduced dim (amin: of -x)",
          check=_extreme_check)
def _amax(b: Builder, node: fx.Node, x: Val, dims: Any = (), keepdim: bool = False) -> Tensor:
    return b.reshape(_extreme(b, x, list(dims), node.target == aten.amin.default), shape_of(node))


@register(aten.max.default, aten.min.default, notes="ggml_pool_1d max over every dim (min: of -x)",
          check=_extreme_check)
def _max_all(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return b.reshape(_extreme(b, x, None, node.target == aten.min.default), shape_of(node))


@register(aten.aminmax.default, notes="ggml_pool_1d max of -x and of x", check=_extreme_check)
def _aminmax(b: Builder, node: fx.Node, x: Val, *, dim: int | None = None, keepdim: bool = False) -> Any:
    shape = tuple(int(d) for d in val(node)[0].shape)
    return (b.reshape(_extreme(b, x, dim, True), shape), b.reshape(_extreme(b, x, dim, False), shape))


def _max_dim_check(node: fx.Node) -> str | None:
    why = _extreme_check(node)
    if why is None and any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "its indices are used (only the values are lowered)"
    return why


@register(aten.max.dim, aten.min.dim, notes="ggml_pool_1d max over the dim (min: of -x); the values only",
          check=_max_dim_check)
def _max_dim(b: Builder, node: fx.Node, x: Val, dim: int, keepdim: bool = False) -> Any:
    shape = tuple(int(d) for d in val(node)[0].shape)
    return (b.reshape(_extreme(b, x, dim, node.target == aten.min.dim), shape), None)
