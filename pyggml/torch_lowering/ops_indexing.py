"""Indexing and attention: embedding, index_select (``ggml_get_rows``), scaled dot-product
attention (``ggml_mul_mat`` + ``ggml_soft_max_ext`` + ``ggml_mul_mat``), rows written
(``index_put``: ``ggml_set_rows``)."""
from __future__ import annotations

import math
import operator
from typing import Any, cast

import numpy as np
import torch
from torch import fx

from ..backends.cpu import FLASH_ATTN_TILE_ROWS
from ..core.tensor import Tensor
from ..enums import GGMLType
from .graph import Builder
from .layout import INDEX_DTYPES, shape_of, val
from .rewrites import IN_PLACE
from .table import LoweringError, Val, args_of, constant_value, int_bound, kw_of, register

aten = torch.ops.aten


def _rows(b: Builder, node: fx.Node, table: Val, idx: Val) -> Tensor:
    """Rows ``idx`` (any shape) of 2-dim ``table`` -> torch shape idx.shape + (D,)."""
    flat = b.reshape(idx.t, (int(np.prod(idx.shape)) if idx.shape else 1,))
    return b.reshape(b.ctx.get_rows(table.t, flat), shape_of(node))


def _embedding_check(node: fx.Node) -> str | None:
    if val(args_of(node)[0]).dim() != 2:
        return "a table of other than 2 dims"
    return None if not any(args_of(node)[3:5]) else "scale_grad_by_freq or sparse"


@register(aten.embedding.default, notes="ggml_get_rows (I32 indices)", check=_embedding_check, index_args=(1,))
def _embedding(b: Builder, node: fx.Node, weight: Val, idx: Val, *rest: Any) -> Tensor:
    return _rows(b, node, weight, idx)


def _index_select_check(node: fx.Node) -> str | None:
    if val(args_of(node)[0]).dim() != 2 or args_of(node)[1] not in (0, -2):
        return "other than rows of a 2-dim tensor"
    return None


@register(aten.index_select.default, notes="ggml_get_rows (I32 indices)", check=_index_select_check, index_args=(2,))
def _index_select(b: Builder, node: fx.Node, x: Val, dim: int, idx: Val) -> Tensor:
    return _rows(b, node, x, idx)


def _in_place_rows(b: Builder, t: Tensor) -> Tensor:
    """``t`` as is where its rows are contiguous (a head view of Q or K: ggml's product reads
    it in place), else a contiguous copy."""
    return t if t.nb[0] == 4 and not t.is_transposed() else b.ctx.cont(t)


def _named(node: fx.Node, rest: list[Any], kw: dict[str, Any]) -> dict[str, Any]:
    """The attention's arguments after q, k, v by name (the two overloads order them apart)."""
    names = ["attn_mask", "dropout_p", "is_causal"] if node.target == aten.scaled_dot_product_attention.default \
        else ["dropout_p", "is_causal"]
    return {**kw, **dict(zip(names, rest))}


def _sdpa_check(node: fx.Node) -> str | None:
    q, k, v = (val(a) for a in args_of(node)[:3])
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k, v of other than 4 dims"
    kw = _named(node, args_of(node)[3:], kw_of(node))
    if kw.get("dropout_p", 0.0):
        return "dropout"
    # grouped-query attention: q head h reads k and v head h // (q heads / k heads), as torch's CPU
    # kernel (which takes fewer k heads) and enable_gqa do; so do ggml's kernels, by broadcasting
    gqa = bool(kw.get("enable_gqa")) or node.target == aten._scaled_dot_product_flash_attention_for_cpu.default
    mask = kw.get("attn_mask")
    if mask is not None:
        m = val(mask)
        if m.dtype not in (torch.float32, torch.bool):
            return f"a {m.dtype} mask"
        if m.dim() > 4 or tuple(m.shape[-2:]) != (q.shape[-2], k.shape[-2]) and m.shape[-2] != 1:
            return "a mask of another shape"
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]:
        return "batches, or k and v heads or lengths, that differ"
    if q.shape[1] != k.shape[1] and not (gqa and k.shape[1] and q.shape[1] % k.shape[1] == 0):
        return "q and k heads that differ" + ("" if gqa else " (without enable_gqa)")
    if node.target != aten.scaled_dot_product_attention.default and any(
            u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "its log-sum-exp is used (only the attention output is lowered)"
    return None


def _unrepeated(b: Builder, node: fx.Node, i: int, x: Val) -> Val:
    """Argument ``i`` of attention ``node`` (K or V, torch shape [B, H, S, E]) before a
    ``repeat_interleave`` of its heads (grouped-query attention), where it is one: ggml's
    products broadcast K's and V's heads over Q's that way (head h reads head h // n), so the
    repeated heads are never made."""
    src = args_of(node)[i]
    if not (isinstance(src, fx.Node) and src.target == aten.repeat_interleave.self_int):
        return x
    a = args_of(src)
    inner = b.env.get(a[0])
    if not isinstance(inner, Val) or inner.ndim != 4 or len(a) < 3 or a[2] not in (1, -3):
        return x
    return inner


def _sdpa(b: Builder, node: fx.Node, q: Val, k: Val, v: Val, *args: Any, **kwargs: Any) -> Any:
    kw = _named(node, list(args), kwargs)
    mask, causal, scale = kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale")
    B, H, L, E = q.shape
    S = k.shape[2]
    ctx = b.ctx
    if scale is None:
        scale = 1.0 / math.sqrt(E)
    k, v = _unrepeated(b, node, 1, k), _unrepeated(b, node, 2, v)
    m: Tensor | None = None
    if mask is not None:
        mshape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
        m = b.contig(b.reshape(mask.t, mshape))
        mask_node = kw_of(node).get("attn_mask")
        if mask_node is None and node.target == aten.scaled_dot_product_attention.default:
            mask_node = (args_of(node) + [None] * 4)[3]
        if val(mask_node).dtype == torch.bool:   # True: attend; False: -1e30 (exp gives 0)
            m = ctx.scale(ctx.sub(m, b.constant(1.0)), 1e30)
        if mshape[2] != L:   # the kernels' mask covers every query row
            m = ctx.repeat(m, ctx.new_tensor(m.type, [S, L, mshape[1], mshape[0]]))
    if causal:
        tri = np.triu(np.full((L, S), -np.inf, np.float32), k=1 + S - L)
        c = b.constant(tri)
        m = c if m is None else ctx.add(ctx.cont(m), c)
    if b.flash_attn and (m is None or m.ne[2] in (1, H)) and (m is None or m.ne[3] in (1, B)):
        # one node: softmax(scale K Q^T + mask) V, K and V read in place (their rows are
        # contiguous), the mask as F16 (-1e30 and -inf both mean "masked" there)
        qt, kt, vt = _in_place_rows(b, q.t), _in_place_rows(b, k.t), _in_place_rows(b, v.t)
        G = _group(b, qt, kt, vt, m, B) if L < FLASH_ATTN_TILE_ROWS else 1
        if G > 1:   # G sequences one block of G*L query rows (see _group), each seeing its own keys
            o = ctx.flash_attn(_grouped(b, qt, G), _grouped(b, kt, G), _grouped(b, vt, G),
                               _block_mask(b, m, S, L, B, G), float(scale))   # ne [Ev, H, G*L, B/G]
            o = ctx.reshape(o, o.ne[0], H, L, B)
        else:
            fm = None if m is None else ctx.cast(ctx.cont(m), GGMLType.F16)
            o = ctx.flash_attn(qt, kt, vt, fm, float(scale))               # ne [Ev, H, L, B]
        out = ctx.permute(o, 0, 2, 1, 3)                                # ne [Ev, L, H, B]
    else:
        kq = ctx.mul_mat(_in_place_rows(b, k.t), _in_place_rows(b, q.t))    # ne [S, L, H, B]
        attn = ctx.soft_max(kq, m, float(scale))                            # ne [S, L, H, B]
        vt = ctx.cont(ctx.permute(v.t, 1, 0, 2, 3))                         # ne [S, Ev, H, B]
        out = ctx.mul_mat(vt, attn)                                         # ne [Ev, L, H, B]
    if node.target == aten.scaled_dot_product_attention.default:
        return out
    return (out,) + (None,) * (len(val(node)) - 1)


def _group(b: Builder, q: Tensor, k: Tensor, v: Tensor, m: Tensor | None, B: int) -> int:
    """How many of the B sequences share one attention block on the CPU backend: the fewest
    that make FLASH_ATTN_TILE_ROWS query rows (the kernel's tiled path) among the divisors of
    B, or 1: not on the CPU alone, a mask per head, or a layout in which a sequence's rows do
    not follow the previous sequence's (q, k and v ne [E, L, H, B]: the batch's stride must be
    L times the rows')."""
    if not b.on_cpu or B < 2 or (m is not None and m.ne[2] != 1):
        return 1
    if any(t.nb[3] != t.ne[1] * t.nb[1] for t in (q, k, v)):
        return 1
    L = q.ne[1]
    for G in range(-(-FLASH_ATTN_TILE_ROWS // L), B + 1):
        if B % G == 0:
            return G
    return 1


def _grouped(b: Builder, t: Tensor, G: int) -> Tensor:
    """q, k or v (ne [E, L, H, B], B's stride L rows') as ne [E, G*L, H, B/G]: G sequences'
    rows one after the other (a view)."""
    E, L, H, B = t.ne
    return b.ctx.view(t, [E, G * L, H, B // G], nb=[t.nb[1], t.nb[2], G * t.nb[3]], offset=0)


def _block_mask(b: Builder, m: Tensor | None, S: int, L: int, B: int, G: int) -> Tensor:
    """The F16 mask of G sequences sharing a block (ne [G*S, G*L, 1, B/G]): sequence g's
    queries see its own keys through its mask ``m`` (ne [S, L, 1, 1 or B], or None: all of
    them), the others' keys -inf."""
    ctx = b.ctx
    off = np.full((G, 1, G, S), -np.inf, np.float32)       # NumPy order of ne [S, G(k), 1, G(q)]
    off[np.arange(G), 0, np.arange(G), :] = 0.0
    own = b.constant(off.reshape(G, 1, G * S))              # ne [G*S, 1, G]: 0 where k's g is q's g
    if m is None:
        grid = ctx.repeat(own, ctx.new_tensor(GGMLType.F32, [G * S, L, G, B // G]))
    else:
        full = ctx.cont(m) if m.ne[3] == B else ctx.repeat(m, ctx.new_tensor(GGMLType.F32, [S, L, 1, B]))
        rows = ctx.repeat(ctx.reshape(full, S, 1, L * B), ctx.new_tensor(GGMLType.F32, [S, G, L * B]))
        grid = ctx.add(ctx.reshape(rows, G * S, L, G, B // G), own)   # ne [G*S, L, G(q), B/G]
    return ctx.reshape(ctx.cast(grid, GGMLType.F16), G * S, G * L, 1, B // G)


register(aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
         notes="ggml_flash_attn_ext (scale, float or bool mask as F16, causal mask; on the CPU backend, "
               "sequences of fewer than 64 queries in shared blocks of 64 rows, a block-diagonal mask), "
               "or ggml_mul_mat + "
               "ggml_soft_max_ext + ggml_mul_mat for a mask per head of another count (K and V heads "
               "repeated by repeat_interleave are read unrepeated, broadcast by the kernels)",
         check=_sdpa_check, mask_args=(3, "attn_mask"))(_sdpa)


def _index_check(node: fx.Node) -> str | None:
    x, idx = val(args_of(node)[0]), args_of(node)[1]
    if not all(isinstance(i, fx.Node) for i in idx):
        return "a slice among the indices"
    bad = [val(i).dtype for i in idx if val(i).dtype not in INDEX_DTYPES]
    if bad:
        return f"an index of {bad[0]}"
    if x.dim() == 2 and len(idx) == 1:
        return None
    if len(idx) != x.dim():
        return "other than rows of a 2-dim tensor by one index tensor, or an index tensor per dim"
    for i in idx:   # made from numbers and sizes: known when the graph is built
        sources, _, why = int_bound(i)
        if why is not None or any(isinstance(val(p), torch.Tensor) for p in sources):
            return "an index tensor per dim whose values are not constants"
    return None


@register(aten.index.Tensor, notes="ggml_get_rows (rows by one I32 index tensor; an index tensor per dim, made "
          "from constants: the elements' positions, worked out when the graph is built)", check=_index_check,
          index_args=(1,), int_results=True)
def _index(b: Builder, node: fx.Node, x: Val, indices: Any) -> Tensor:
    if len(indices) == 1 and x.ndim == 2:
        return _rows(b, node, x, indices[0])
    # one index tensor per dim, all constants (transformers' padding mask[batch, kv]): the
    # positions of the elements picked, as torch computes them, in a constant
    picks = cast(Any, torch.broadcast_tensors)(*(constant_value(b, i) for i in args_of(node)[1]))
    flat = torch.zeros(picks[0].shape, dtype=torch.int64)
    for dim, (i, size) in enumerate(zip(picks, x.shape)):
        i = torch.where(i < 0, i + size, i)
        if bool(((i < 0) | (i >= size)).any()):
            raise LoweringError(f"an index out of range for dim {dim} of size {size}")
        flat = flat * size + i
    rows = b.constant(flat.reshape(-1).numpy(), np.int32)
    table = b.reshape(x.t, (int(np.prod(x.shape)), 1))
    return b.reshape(b.ctx.get_rows(table, rows), shape_of(node))


def _index_put_check(node: fx.Node) -> str | None:
    a = args_of(node)
    x, indices = val(a[0]), a[1]
    if len(a) > 3 and a[3]:
        return "accumulate=True"
    if x.dim() < 2 or len(indices) != x.dim() - 1 or any(i is not None for i in indices[:-1]) \
            or not isinstance(indices[-1], fx.Node):
        return "other than rows (the next-to-last dim) by one index tensor"
    idx, v = val(indices[-1]), val(a[2])
    if idx.dim() != 1 or idx.dtype not in (torch.int64, torch.int32):
        return "other than a 1-dim int64/int32 index"
    want = tuple(x.shape[:-2]) + (idx.shape[0], x.shape[-1])
    if tuple(v.shape) != want or v.dtype != x.dtype:
        return f"values of shape {tuple(v.shape)}, not {want}"
    return None


@register(aten.index_put.default, notes="ggml_set_rows (I32 indices) into a copy of self, or into self's own "
          "memory where self is a graph input the graph mutates (``index_copy_``: a static KV cache)",
          check=_index_put_check, index_args=(1,))
def _index_put(b: Builder, node: fx.Node, x: Val, indices: list[Any], values: Val, *rest: Any) -> Tensor:
    dst = x.t if node.meta.get(IN_PLACE) else b.ctx.cont(x.t)
    return b.ctx.set_rows(dst, b.contig(values.t), indices[-1].t)


def _gather_check(node: fx.Node) -> str | None:
    a = args_of(node)
    x, idx = val(a[0]), val(a[2])
    if len(a) > 3 and a[3] or kw_of(node).get("sparse_grad"):
        return "sparse_grad"
    if x.dim() > 3 or x.dim() < 1 or idx.dim() != x.dim():
        return "other than 1 to 3 dims, or an index of another count of dims"
    d = a[1] % x.dim()
    if any(idx.shape[i] != x.shape[i] for i in range(x.dim()) if i != d):
        return "an index smaller than the input along another dim than the gathered one"
    return None


@register(aten.gather.default, notes="ggml_get_rows of each element as a row, batched over the other dims "
          "(the dim swapped to the last first)", check=_gather_check, index_args=(2,), int_results=True)
def _gather(b: Builder, node: fx.Node, x: Val, dim: int, idx: Val, *rest: Any) -> Tensor:
    n = x.ndim
    ctx = b.ctx
    last = (dim % n) == n - 1
    xt, it = x.t, idx.t
    if not last:   # the gathered dim to ne[0] (torch's last) for both
        axes = [0, 1, 2, 3]
        ax = n - 1 - dim % n
        axes[0], axes[ax] = ax, 0
        xt, it = ctx.permute(xt, *axes), ctx.permute(it, *axes)
    xs, ks = b.contig(xt), b.contig(it)
    C, K = xs.ne[0], ks.ne[0]
    rows = ctx.reshape(xs, 1, C, xs.ne[1], xs.ne[2])                   # each element a row
    out = ctx.get_rows(rows, ctx.reshape(ks, K, ks.ne[1], ks.ne[2]))   # ne [1, K, R, S]
    out = ctx.reshape(out, K, ks.ne[1], ks.ne[2], 1)
    return out if last else ctx.permute(out, *axes)
