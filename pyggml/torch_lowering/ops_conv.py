"""Convolutions, pooling and resizing: ``convolution`` (1-d and 2-d, groups 1), max and average
pooling, adaptive average pooling to sizes that divide the input, nearest upsampling by integer
factors.

torch's ``[N, C, H, W]`` is ggml ``ne [W, H, C, N]``, the layout ggml's ``conv_2d`` and
``pool_2d`` take and give.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
from torch import fx

from ..core.tensor import Tensor
from ..enums import GGMLType
from .graph import Builder
from .layout import shape_of, val
from .table import Val, args_of, kw_of, register

aten = torch.ops.aten


def _conv_check(node: fx.Node) -> str | None:
    args = list(args_of(node)) + [None] * 9
    x, w = val(args_of(node)[0]), val(args_of(node)[1])
    transposed, groups = args[6], args[8]
    if transposed:
        return "a transposed convolution"
    if groups != 1:
        return f"groups={groups}"
    if x.dim() not in (3, 4) or w.dim() != x.dim():
        return "other than a 1-d or 2-d convolution of a batch"
    return None


@register(aten.convolution.default,
          notes="ggml_im2col (F32) + ggml_mul_mat + ggml_permute, as ggml_conv_1d/2d but in float32 (theirs "
                "round the patches to F16), ggml_add", check=_conv_check)
def _convolution(b: Builder, node: fx.Node, x: Val, w: Val, bias: Val | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Tensor:
    ctx = b.ctx
    kernel, inp = b.contig(w.t), b.contig(x.t)
    if x.ndim == 3:   # kernel ne [K, IC, OC], x ne [L, IC, N]
        im = ctx.im2col(kernel, inp, stride[0], 0, padding[0], 0, dilation[0], 0, False, GGMLType.F32)
        ol, n = im.ne[1], im.ne[2]                                     # im ne [IC*K, OL, N]
        oc = kernel.ne[2]
        res = ctx.mul_mat(ctx.reshape(im, im.ne[0], ol * n), ctx.reshape(kernel, kernel.ne[0] * kernel.ne[1], oc))
        out = ctx.cont(ctx.permute(ctx.reshape(res, ol, n, oc), 0, 2, 1, 3))   # [OL, N, OC] -> [OL, OC, N]
    else:             # kernel ne [KW, KH, IC, OC], x ne [W, H, IC, N]; torch's pairs are (h, w)
        im = ctx.im2col(kernel, inp, stride[1], stride[0], padding[1], padding[0], dilation[1], dilation[0],
                        True, GGMLType.F32)
        ow, oh, n = im.ne[1], im.ne[2], im.ne[3]                      # im ne [IC*KH*KW, OW, OH, N]
        oc = kernel.ne[3]
        res = ctx.mul_mat(ctx.reshape(im, im.ne[0], ow * oh * n),
                          ctx.reshape(kernel, kernel.ne[0] * kernel.ne[1] * kernel.ne[2], oc))
        out = ctx.cont(ctx.permute(ctx.reshape(res, ow, oh, n, oc), 0, 1, 3, 2))   # -> [OW, OH, OC, N]
    if bias is not None:
        ch = (bias.shape[0],) + (1,) * (x.ndim - 2)
        out = ctx.add(out, b.reshape(bias.t, ch))
    return out


def _pool_check(node: fx.Node) -> str | None:
    args = list(args_of(node))
    kernel = args[1]
    padding = args[3] if len(args) > 3 else [0]
    if val(args_of(node)[0]).dim() != 4 or len(kernel) != 2:
        return "other than 2-d pooling of a batch"
    if any(padding):
        return "padding"
    if node.target == aten.max_pool2d_with_indices.default:
        dilation = args[4] if len(args) > 4 else [1]
        ceil = args[5] if len(args) > 5 else False
        if any(d != 1 for d in dilation) or ceil:
            return "dilation or ceil_mode"
        if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
            return "its indices are used"
    else:
        ceil = args[4] if len(args) > 4 else False
        divisor = args[6] if len(args) > 6 else None
        if ceil or divisor is not None:
            return "ceil_mode or divisor_override"
    return None


def _pool(b: Builder, node: fx.Node, x: Val, kernel: Sequence[int], stride: Sequence[int] = (),
          *rest: Any) -> Any:
    stride = list(stride) or list(kernel)
    op = "max" if node.target == aten.max_pool2d_with_indices.default else "avg"
    out = b.ctx.pool_2d(b.contig(x.t), op, kernel[1], kernel[0], stride[1], stride[0])
    return (out, None) if op == "max" else out


register(aten.max_pool2d_with_indices.default, aten.avg_pool2d.default,
         notes="ggml_pool_2d (no padding)", check=_pool_check)(_pool)


def _adaptive_check(node: fx.Node) -> str | None:
    x = val(args_of(node)[0])
    size = args_of(node)[1]
    if x.dim() != 4 or len(size) != 2 or x.shape[2] % size[0] or x.shape[3] % size[1]:
        return "output sizes that do not divide the input's"
    return None


@register(aten._adaptive_avg_pool2d.default, notes="ggml_pool_2d avg (sizes that divide the input)",
          check=_adaptive_check)
def _adaptive_avg(b: Builder, node: fx.Node, x: Val, size: Sequence[int]) -> Tensor:
    kh, kw = x.shape[2] // size[0], x.shape[3] // size[1]
    return b.ctx.pool_2d(b.contig(x.t), "avg", kw, kh, kw, kh)


def _upsample_check(node: fx.Node) -> str | None:
    x, out = val(args_of(node)[0]), val(node)
    if x.dim() != 4 or out.shape[2] % x.shape[2] or out.shape[3] % x.shape[3]:
        return "other than integer factors of a 4-dim tensor"
    return None


@register(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default,
          notes="ggml_interpolate, nearest (integer factors)", check=_upsample_check)
def _upsample(b: Builder, node: fx.Node, x: Val, *rest: Any) -> Tensor:
    shape = shape_of(node)
    return b.ctx.interpolate(b.contig(x.t), [shape[3], shape[2], shape[1], shape[0]], 0)


def _upsample1d_check(node: fx.Node) -> str | None:
    x, out = val(args_of(node)[0]), val(node)
    if x.dim() != 3 or out.shape[2] % x.shape[2]:
        return "other than an integer factor of a 3-dim tensor"
    return None


@register(aten.upsample_nearest1d.vec, aten.upsample_nearest1d.default,
          notes="ggml_interpolate, nearest (an integer factor)", check=_upsample1d_check)
def _upsample1d(b: Builder, node: fx.Node, x: Val, *rest: Any) -> Tensor:
    shape = shape_of(node)
    return b.ctx.interpolate(b.contig(x.t), [shape[2], shape[1], shape[0], 1], 0)
