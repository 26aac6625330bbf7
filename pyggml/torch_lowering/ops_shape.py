"""Shape ATen ops: views, reshapes, permutations, expansion, slices, concatenation, copies.

A view keeps ggml's strides where ggml can express them (permute, transpose, slices along any
but the fastest dim); otherwise the tensor is made contiguous first (``ggml_cont``).
"""
from __future__ import annotations

from typing import Any, Sequence, cast

import numpy as np
import torch
from torch import fx

from ..core.tensor import Tensor
from .graph import Builder
from .layout import INDEX_DTYPES, MAX_DIMS, axis_of, shape_of, val
from .table import Val, args_of, kw_of, register

aten = torch.ops.aten


def _reshape(b: Builder, node: fx.Node, x: Val, *rest: Any) -> Tensor:
    return b.reshape(x.t, shape_of(node))


register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
         aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints,
         aten.unflatten.int, int_results=True,
         notes="ggml_reshape (after ggml_cont where the source is not contiguous)")(_reshape)


def _same(b: Builder, node: fx.Node, x: Val, *rest: Any, **kw: Any) -> Tensor:
    return x.t


_EXACT = (*INDEX_DTYPES, torch.bool)


def _copy_check(node: fx.Node) -> str | None:
    v, src = val(node), val(args_of(node)[0])
    if v.dtype != src.dtype and not (src.dtype in _EXACT and v.dtype in (*_EXACT, torch.float32)):
        return f"a conversion from {src.dtype} to {v.dtype}"
    layout = kw_of(node).get("layout")
    device = kw_of(node).get("device")
    if (layout not in (None, torch.strided)) or (device is not None and torch.device(device).type != "cpu"):
        return "another layout or device"
    return None


register(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, int_results=True,
         notes="the same tensor (ggml keeps values, not identities)")(_same)
register(aten.clone.default, aten.contiguous.default, int_results=True,
         notes="the same tensor: ggml_cont where a contiguous copy is needed", check=_copy_check)(_same)


@register(aten._to_copy.default, int_results=True, check=_copy_check,
          notes="the same tensor; between integers (I32), bools (F32 0/1) and float32: ggml_cast, and "
                "ggml_step(ggml_abs(x)) to bool")
def _to_copy(b: Builder, node: fx.Node, x: Val, *rest: Any, **kw: Any) -> Tensor:
    src, dst = val(args_of(node)[0]).dtype, val(node).dtype
    ctx, t = b.ctx, x.t
    if src == dst or (src in INDEX_DTYPES and dst in INDEX_DTYPES):
        return t
    if dst == torch.bool:   # from an integer: nonzero
        return ctx.step(ctx.abs(b.as_f32(x).t))
    if dst == torch.float32:   # from an integer (rounded to nearest, as torch does) or a bool
        return cast(Tensor, b.as_f32(x).t)
    return b.as_i32(t)   # a bool to an integer


def _perm_axes(perm: Sequence[int], n: int) -> list[int]:
    """ggml_permute's axes for torch's ``permute(perm)`` of an n-dim tensor: out dim i is in
    dim perm[i], so ggml axis n-1-perm[i] goes to axis n-1-i."""
    axes = list(range(MAX_DIMS))
    for i, p in enumerate(perm):
        axes[n - 1 - (p % n)] = n - 1 - i
    return axes


def _permute_val(b: Builder, x: Val, perm: Sequence[int]) -> Tensor:
    n = x.ndim
    perm = [p % n for p in perm]
    if perm == list(range(n)):
        return x.t
    out = b.ctx.permute(x.t, *_perm_axes(perm, n))
    if n >= 2 and perm[:-2] == list(range(n - 2)) and x.t.is_contiguous():
        b.transposed_of[id(out)] = x.t   # the last two dims swapped: mm reads the source as is
    return out


@register(aten.permute.default, notes="ggml_permute (a view)", int_results=True)
def _permute(b: Builder, node: fx.Node, x: Val, perm: Sequence[int]) -> Tensor:
    return _permute_val(b, x, perm)


@register(aten.transpose.int, notes="ggml_permute (a view)", int_results=True)
def _transpose(b: Builder, node: fx.Node, x: Val, d0: int, d1: int) -> Tensor:
    perm = list(range(x.ndim))
    if x.ndim:
        d0, d1 = d0 % x.ndim, d1 % x.ndim
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute_val(b, x, perm)


@register(aten.t.default, notes="ggml_transpose (a view)", int_results=True)
def _t(b: Builder, node: fx.Node, x: Val) -> Tensor:
    return _permute_val(b, x, [1, 0]) if x.ndim == 2 else x.t


@register(aten.expand.default, notes="ggml_repeat", int_results=True)
def _expand(b: Builder, node: fx.Node, x: Val, sizes: Sequence[int], implicit: bool = False) -> Tensor:
    return b.expand(x, shape_of(node))


def _slice_check(node: fx.Node) -> str | None:
    step = args_of(node)[4] if len(args_of(node)) > 4 else 1
    dim = args_of(node)[1] if len(args_of(node)) > 1 else 0
    src = val(args_of(node)[0])
    if step != 1 and axis_of(dim, src.dim()) == 0:
        return "a step along the last dim (ggml strides its fastest dim by one element)"
    return None


@register(aten.slice.Tensor, notes="ggml_view with an offset and strides", check=_slice_check, int_results=True)
def _slice(b: Builder, node: fx.Node, x: Val, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Tensor:
    n = x.ndim
    ax = axis_of(dim, n)
    size = x.shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    lo = min(max(lo, 0), size)
    out_ne = list(x.t.ne)
    out_ne[ax] = shape_of(node)[dim % n]
    nb = list(x.t.nb)
    offset = lo * nb[ax]
    nb[ax] *= step
    return b.ctx.view(x.t, out_ne[:n] or [1], nb[1:n], offset)


@register(aten.select.int, notes="ggml_view (and ggml_cont + ggml_reshape for the last dim)", int_results=True)
def _select(b: Builder, node: fx.Node, x: Val, dim: int, index: int) -> Tensor:
    return _select_val(b, x, dim, index % x.shape[dim], shape_of(node))


@register(aten.cat.default, notes="ggml_concat, pairwise", int_results=True)
def _cat(b: Builder, node: fx.Node, xs: Sequence[Val], dim: int = 0) -> Tensor:
    xs = [x for x in xs if 0 not in x.shape]
    n = len(shape_of(node))
    ax = axis_of(dim, n)
    out = b.contig(xs[0].t)
    for x in xs[1:]:
        out = b.ctx.concat(out, b.contig(x.t), ax)
    return out


@register(aten.stack.default, notes="ggml_reshape + ggml_concat")
def _stack(b: Builder, node: fx.Node, xs: Sequence[Val], dim: int = 0) -> Tensor:
    shape = shape_of(node)
    d = dim % len(shape)
    one = shape[:d] + (1,) + shape[d + 1:]
    parts = [Val(b.reshape(x.t, one), one) for x in xs]
    ax = axis_of(d, len(shape))
    out = b.contig(parts[0].t)
    for p in parts[1:]:
        out = b.ctx.concat(out, b.contig(p.t), ax)
    return out


def views_along(b: Builder, x: Val, dim: int, sizes: Sequence[int]) -> tuple[Tensor, ...]:
    """Consecutive slices of ``x`` along ``dim`` of ``sizes`` (views)."""
    n = x.ndim
    ax = axis_of(dim, n)
    out, start = [], 0
    for size in sizes:
        ne, nb = list(x.t.ne[:n]), list(x.t.nb[:n])
        ne[ax] = size
        out.append(b.ctx.view(x.t, ne or [1], nb[1:], start * nb[ax]))   # the strides kept
        start += size
    return tuple(out)


@register(aten.split.Tensor, notes="ggml_view per part")
def _split(b: Builder, node: fx.Node, x: Val, size: int, dim: int = 0) -> tuple[Tensor, ...]:
    total = x.shape[dim]
    return views_along(b, x, dim, [min(size, total - s) for s in range(0, total, size)])


@register(aten.split_with_sizes.default, notes="ggml_view per part")
def _split_sizes(b: Builder, node: fx.Node, x: Val, sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    return views_along(b, x, dim, list(sizes))


@register(aten.unbind.int, notes="ggml_view per index (ggml_cont + ggml_reshape along the last dim)")
def _unbind(b: Builder, node: fx.Node, x: Val, dim: int = 0) -> tuple[Tensor, ...]:
    parts = []
    for i, fake in enumerate(val(node)):
        parts.append(_select_val(b, x, dim, i, tuple(fake.shape)))
    return tuple(parts)


def _select_val(b: Builder, x: Val, dim: int, index: int, out_shape: tuple[int, ...]) -> Tensor:
    """Index ``index`` of torch dim ``dim``: a view without that dim; along the fastest dim a
    column, whose elements are a row apart, copied and reshaped."""
    n = x.ndim
    ax = axis_of(dim, n)
    ne, nb = list(x.t.ne[:n]), list(x.t.nb[:n])
    offset = index * nb[ax]
    if ax == 0:
        col = b.ctx.view(x.t, [1] + ne[1:], nb[1:], offset)
        return b.reshape(b.ctx.cont(col), out_shape)
    del ne[ax], nb[ax]
    return b.ctx.view(x.t, ne or [1], nb[1:], offset)


@register(aten.narrow.default, notes="ggml_view")
def _narrow(b: Builder, node: fx.Node, x: Val, dim: int, start: int, length: int) -> Tensor:
    return views_along(b, x, dim, [start, length])[1] if start else views_along(b, x, dim, [length])[0]


@register(aten.repeat.default, notes="ggml_repeat (torch's repeat tiles, as ggml's does)")
def _repeat(b: Builder, node: fx.Node, x: Val, repeats: Sequence[int]) -> Tensor:
    shape = shape_of(node)
    padded = (1,) * (len(shape) - x.ndim) + tuple(x.shape)
    t = b.reshape(x.t, padded)
    return b.ctx.repeat(t, b.ctx.new_tensor(t.type, [int(d) for d in reversed(shape)]))


def _pad_check(node: fx.Node) -> str | None:
    pad = list(args_of(node)[1])
    value = args_of(node)[2] if len(args_of(node)) > 2 else kw_of(node).get("value", 0)
    if value != 0:
        return "a pad value other than 0"
    if min(pad) < 0:
        return "negative padding (cropping)"
    if len(pad) > 2 * MAX_DIMS:
        return "padding of more than 4 dims"
    return None


@register(aten.constant_pad_nd.default, notes="ggml_pad_ext (zeros)", check=_pad_check)
def _pad(b: Builder, node: fx.Node, x: Val, pad: Sequence[int], value: float = 0) -> Tensor:
    left, right = [0, 0, 0, 0], [0, 0, 0, 0]
    for i in range(len(pad) // 2):   # pairs from the last torch dim = ggml axis 0
        left[i], right[i] = int(pad[2 * i]), int(pad[2 * i + 1])
    return b.ctx.pad(b.contig(x.t), *right, left=left)


# the *_copy forms of the views (functionalized and edge-dialect graphs): the same values
for _copy, _fn, _check in ((aten.view_copy.default, _reshape, None), (aten.permute_copy.default, _permute, None),
                           (aten.t_copy.default, _t, None), (aten.transpose_copy.int, _transpose, None),
                           (aten.unsqueeze_copy.default, _reshape, None), (aten.squeeze_copy.dim, _reshape, None),
                           (aten.squeeze_copy.dims, _reshape, None), (aten.expand_copy.default, _expand, None),
                           (aten.slice_copy.Tensor, _slice, _slice_check), (aten.select_copy.int, _select, None),
                           (aten.alias_copy.default, _same, None), (aten.split_copy.Tensor, _split, None),
                           (aten.split_with_sizes_copy.default, _split_sizes, None),
                           (aten.unbind_copy.int, _unbind, None)):
    register(_copy, notes="as the view it copies (ggml_view, ggml_permute, ggml_reshape...; ggml_cont where "
                          "a contiguous tensor is needed)", check=_check)(_fn)


def _repeat_interleave_check(node: fx.Node) -> str | None:
    args = args_of(node)
    if len(args) < 3 or not isinstance(args[1], int) or args[2] is None or kw_of(node).get("output_size") not in (None, 0):
        return "other than an int count of repeats along one dim"
    return None


@register(aten.repeat_interleave.self_int,
          notes="ggml_reshape to [below, 1, dim, above] + ggml_repeat + ggml_reshape", check=_repeat_interleave_check)
def _repeat_interleave(b: Builder, node: fx.Node, x: Val, n: int, dim: int, *rest: Any, **kw: Any) -> Tensor:
    ax = axis_of(dim, x.ndim)
    ne = list(x.t.ne)
    below, above = 1, 1
    for k in range(ax):
        below *= ne[k]
    for k in range(ax + 1, 4):
        above *= ne[k]
    t = b.ctx.reshape(b.contig(x.t), below, 1, ne[ax], above)
    t = b.ctx.repeat(t, b.ctx.new_tensor(t.type, [below, n, ne[ax], above]))
    return b.reshape(t, shape_of(node))


register(aten.narrow_copy.default, notes="as narrow (ggml_view)")(_narrow)
register(aten.swapaxes.default, aten.swapdims.default, notes="as transpose (ggml_permute, a view)")(_transpose)
register(aten.ravel.default, notes="ggml_reshape (after ggml_cont where the source is not contiguous)")(_reshape)


def _roll_check(node: fx.Node) -> str | None:
    args = args_of(node)
    dims = args[2] if len(args) > 2 else kw_of(node).get("dims", [])
    return None if dims else "a roll of the flattened tensor (no dims)"


@register(aten.roll.default, notes="ggml_roll (a shift per ggml axis)", check=_roll_check)
def _roll(b: Builder, node: fx.Node, x: Val, shifts: Any, dims: Any = ()) -> Tensor:
    sh = [shifts] if isinstance(shifts, int) else list(shifts)
    dl = [dims] if isinstance(dims, int) else list(dims)
    s = [0, 0, 0, 0]
    for k, d in zip(sh, dl):
        ax = axis_of(d, x.ndim)
        s[ax] += int(k)
    ne = x.t.ne
    return b.ctx.roll(b.contig(x.t), *[s[i] % ne[i] if ne[i] else 0 for i in range(4)])


def _tri_check(node: fx.Node) -> str | None:
    args = args_of(node)
    diagonal = args[1] if len(args) > 1 else kw_of(node).get("diagonal", 0)
    x = val(args[0])
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        return "not square in the last two dims (ggml_tri)"
    ok = (0, 1) if node.target == aten.triu.default else (0, -1)
    return None if diagonal in ok else f"diagonal {diagonal} (ggml_tri keeps {ok})"


@register(aten.triu.default, aten.tril.default,
          notes="ggml_tri (triu diagonal 0 or 1, tril diagonal 0 or -1)", check=_tri_check)
def _tri(b: Builder, node: fx.Node, x: Val, diagonal: int = 0) -> Tensor:
    # ggml's ne[0] is torch's last dim (the column), ne[1] the row
    upper = node.target == aten.triu.default
    kind = (0 if diagonal == 0 else 1) if upper else (2 if diagonal == 0 else 3)   # GGML_TRI_TYPE_*
    return b.ctx.tri(b.contig(x.t), kind)


def _reflect_check(node: fx.Node) -> str | None:
    pad = list(args_of(node)[1])
    x = val(args_of(node)[0])
    if len(pad) != 2 or min(pad) < 0:
        return "other than two non-negative pads"
    return None if max(pad) < x.shape[-1] else "a pad as long as the dim (torch refuses it)"


@register(aten.reflection_pad1d.default, notes="ggml_pad_reflect_1d (the last dim)", check=_reflect_check)
def _reflection_pad1d(b: Builder, node: fx.Node, x: Val, pad: Sequence[int]) -> Tensor:
    return b.ctx.pad_reflect_1d(b.contig(x.t), int(pad[0]), int(pad[1]))


def _copy_of_check(node: fx.Node) -> str | None:
    dst, src = (val(a) for a in args_of(node)[:2])
    if dst.dtype != src.dtype:
        return f"a conversion from {src.dtype} to {dst.dtype}"
    return None


@register(aten.copy.default, notes="the source, broadcast to the destination's shape (ggml_repeat)",
          check=_copy_of_check)
def _copy_of(b: Builder, node: fx.Node, dst: Val, src: Val, non_blocking: bool = False) -> Tensor:
    return b.expand(src, shape_of(node))


def _scatter_check(node: fx.Node) -> str | None:
    args = args_of(node)
    if node.target == aten.slice_scatter.default:
        step = args[5] if len(args) > 5 else kw_of(node).get("step", 1)
        if step != 1:
            return f"step {step}"
    return None


def _write_along(b: Builder, x: Val, src: Tensor, dim: int, start: int) -> Tensor:
    """x (a contiguous copy) with ``src`` (x's ndim, contiguous) written from ``start`` along
    torch dim ``dim``: ggml_set, which copies x and writes src into the view at that offset."""
    t = b.contig(x.t)
    ax = axis_of(dim, x.ndim)
    return b.ctx.set(t, src, t.nb[1], t.nb[2], t.nb[3], start * t.nb[ax])


@register(aten.slice_scatter.default, notes="ggml_set (x copied, src written at the slice; step 1)",
          check=_scatter_check)
def _slice_scatter(b: Builder, node: fx.Node, x: Val, src: Val, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Tensor:
    n = x.shape[dim]
    s = 0 if start is None else int(start)
    s = max(0, min(n, s + n if s < 0 else s))
    return _write_along(b, x, b.contig(src.t), dim, s)


@register(aten.select_scatter.default, notes="ggml_set (x copied, src written at the index)")
def _select_scatter(b: Builder, node: fx.Node, x: Val, src: Val, dim: int, index: int) -> Tensor:
    d = dim % x.ndim
    n = x.shape[d]
    i = index + n if index < 0 else index
    shape = tuple(x.shape[:d]) + (1,) + tuple(x.shape[d + 1:])
    return _write_along(b, x, b.reshape(b.contig(src.t), shape), d, int(i))


def _swap_to_rows(b: Builder, t: Tensor, ax: int) -> tuple[Tensor, list[int]]:
    """``t`` with ggml axis ``ax`` swapped with axis 1 (the rows ``ggml_get_rows`` picks),
    contiguous, and the permutation that swaps them back."""
    axes = [0, 1, 2, 3]
    axes[1], axes[ax] = ax, 1
    return (b.contig(t) if ax == 1 else b.ctx.cont(b.ctx.permute(t, *axes))), axes


@register(aten.flip.default, notes="ggml_get_rows of reversed row numbers (each dim swapped to ne[1] first)")
def _flip(b: Builder, node: fx.Node, x: Val, dims: Sequence[int]) -> Tensor:
    n = x.ndim
    t = x.t
    for d in sorted({int(d) % n for d in dims}):
        rows, axes = _swap_to_rows(b, t, axis_of(d, n))
        ne = rows.ne
        order = np.broadcast_to(np.arange(ne[1] - 1, -1, -1, dtype=np.int32), (ne[3], ne[2], ne[1]))
        t = b.ctx.get_rows(rows, b.constant(np.ascontiguousarray(order), np.int32))
        if axes != [0, 1, 2, 3]:
            t = b.ctx.permute(t, *axes)
    return b.contig(t)


def _reflect2d_check(node: fx.Node) -> str | None:
    pad = list(args_of(node)[1])
    x = val(args_of(node)[0])
    if len(pad) != 4 or min(pad) < 0 or x.dim() < 2:
        return "other than four non-negative pads of a tensor of 2+ dims"
    return None if max(pad[:2]) < x.shape[-1] and max(pad[2:]) < x.shape[-2] else \
        "a pad as long as the dim (torch refuses it)"


@register(aten.reflection_pad2d.default, notes="ggml_pad_reflect_1d along the last dim, then along the one before "
          "(permuted to ne[0])", check=_reflect2d_check)
def _reflection_pad2d(b: Builder, node: fx.Node, x: Val, pad: Sequence[int]) -> Tensor:
    ctx = b.ctx
    w = ctx.pad_reflect_1d(b.contig(x.t), int(pad[0]), int(pad[1]))
    h = ctx.pad_reflect_1d(ctx.cont(ctx.permute(w, 1, 0, 2, 3)), int(pad[2]), int(pad[3]))
    return ctx.cont(ctx.permute(h, 1, 0, 2, 3))
