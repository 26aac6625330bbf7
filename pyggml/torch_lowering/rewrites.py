"""Rewrites of an ATen graph before it is partitioned, so that more of it reaches ggml, and
better: ``nn.Linear``'s products read their weight as stored (:func:`linear_products`), and
grouped-query attention's 5-dim repeat of heads becomes one op (:func:`repeated_heads`), and
so does RMS normalisation written out (:func:`rms_norms`), and the rotary embedding
(:func:`rotary_embeddings`, matched with torch's ``subgraph_rewriter``). :func:`rewrite` applies
them, after torch's common subexpression elimination. :func:`mark_in_place` says which ``index_put`` nodes may write
into their input's own memory (a static KV cache updated with ``index_copy_``)."""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.dialect.common.cse_pass import CSEPass
from torch.fx.subgraph_rewriter import replace_pattern_with_filters

from . import custom_ops  # noqa: F401  (registers torch.ops.pyggml.rope)
from .layout import val
from .table import args_of, kw_of

__all__ = [
    "IN_PLACE",
    "empty_concatenations",
    "linear_products",
    "mark_in_place",
    "metadata_assertions",
    "repeated_heads",
    "rewrite",
    "rms_norms",
    "rotary_embeddings",
]

#: ``node.meta`` key set by :func:`mark_in_place`
IN_PLACE = "pyggml_in_place"


def rewrite(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with its common subexpressions computed once (torch's ``CSEPass``: e.g. the same
    attention mask made for every layer, which would be as many inputs of a ggml graph) and
    every rewrite of this module made, recompiled."""
    metadata_assertions(gm)
    result = CSEPass()(gm)
    gm = result.graph_module if result is not None else gm
    repeated_heads(gm)
    rms_norms(gm)
    rotary_embeddings(gm)
    empty_concatenations(gm)
    linear_products(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def metadata_assertions(gm: fx.GraphModule) -> None:
    """In ``gm``, ``torch.export``'s assertions of a tensor's dtype and device before a
    conversion (``aten._assert_tensor_metadata``) removed: the fake tensors already say what
    they assert, and nothing reads their result."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten._assert_tensor_metadata.default \
                and not node.users:
            gm.graph.erase_node(node)


def _replace(gm: fx.GraphModule, node: fx.Node, target: Any, args: tuple[Any, ...]) -> None:
    """``node`` replaced by a call of ``target`` with ``args``, which computes the same tensor
    (its fake tensor is kept)."""
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(target, args)
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)


def linear_products(gm: fx.GraphModule) -> None:
    """In ``gm``, each product by a transposed 2-dim tensor, ``mm(x, t(w))`` or
    ``addmm(b, x, t(w))`` (``nn.Linear`` after ATen's decomposition), written as
    ``linear(x, w[, b])``: the weight is then read by products only, as stored, and can be kept
    in a quantized type (:class:`~pyggml.torch_lowering.graph.LoweredGraph`'s ``weight_type``)."""
    aten = torch.ops.aten
    transposes = {aten.t.default, aten.permute.default, aten.transpose.int}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        args = args_of(node)
        if node.target == aten.addmm.default and (kw_of(node).get("beta", 1) != 1 or kw_of(node).get("alpha", 1) != 1):
            continue
        y = args[1] if node.target == aten.mm.default else args[2]
        if not (isinstance(y, fx.Node) and y.op == "call_function" and y.target in transposes):
            continue
        yargs = args_of(y)
        w = yargs[0]
        wv, xv = val(w), val(args[0] if node.target == aten.mm.default else args[1])
        if not isinstance(wv, torch.Tensor) or wv.dim() != 2 or xv is None or xv.dim() != 2:
            continue
        if y.target == aten.permute.default and list(yargs[1]) not in ([1, 0], [-1, -2]):
            continue
        if y.target == aten.transpose.int and sorted(d % 2 for d in yargs[1:3]) != [0, 1]:
            continue
        bias = None if node.target == aten.mm.default else args[0]
        if bias is not None and (val(bias) is None or val(bias).dim() != 1):
            continue
        x = args[0] if node.target == aten.mm.default else args[1]
        _replace(gm, node, aten.linear.default, (x, w) if bias is None else (x, w, bias))


def repeated_heads(gm: fx.GraphModule) -> None:
    """In ``gm``, each ``view(clone(expand(unsqueeze(x, d))))`` that repeats every slice of
    ``x``'s dim ``d - 1`` n times in a row (grouped-query attention's ``repeat_kv``) written as
    ``repeat_interleave(x, n, d - 1)``: its 5-dim intermediates, which ggml cannot hold, are gone."""
    aten = torch.ops.aten
    views = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in views:
            continue
        src = args_of(node)[0]
        if isinstance(src, fx.Node) and src.target == aten.clone.default:
            src = args_of(src)[0]
        if not (isinstance(src, fx.Node) and src.target == aten.expand.default):
            continue
        uns = args_of(src)[0]
        if not (isinstance(uns, fx.Node) and uns.target == aten.unsqueeze.default):
            continue
        x = args_of(uns)[0]
        xv, ev, ov = val(x), val(src), val(node)
        if not all(isinstance(v, torch.Tensor) for v in (xv, ev, ov)):
            continue
        d = args_of(uns)[1] % (xv.dim() + 1)
        xs, es = tuple(xv.shape), tuple(ev.shape)
        if d == 0 or es[:d] + es[d + 1:] != xs:
            continue
        n = int(es[d])
        want = list(xs)
        want[d - 1] *= n
        if tuple(ov.shape) != tuple(want):
            continue
        _replace(gm, node, aten.repeat_interleave.self_int, (x, n, d - 1))


def rms_norms(gm: fx.GraphModule) -> None:
    """In ``gm``, each ``x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps)`` (an RMS norm as
    transformers' ``LlamaRMSNorm`` writes it, without its weight) written as
    ``rms_norm(x, [x.shape[-1]], None, eps)``: one ggml_rms_norm instead of seven ggml ops."""
    aten = torch.ops.aten
    call = _call
    for node in list(gm.graph.nodes):
        a = call(node, aten.mul.Tensor)
        if a is None or len(a) != 2:
            continue
        for x, r in ((a[0], a[1]), (a[1], a[0])):
            rs = call(r, aten.rsqrt.default)
            add = call(rs[0], aten.add.Tensor) if rs else None
            if rs is None or add is None or len(add) != 2 or not isinstance(add[1], float) \
                    or kw_of(rs[0]).get("alpha", 1) != 1:
                continue
            mean = call(add[0], aten.mean.dim)
            if mean is None or list(mean[1]) not in ([-1], [val(x).dim() - 1]) or not (len(mean) > 2 and mean[2]):
                continue
            sq = call(mean[0], aten.pow.Tensor_Scalar)
            if sq is None or sq[0] is not x or sq[1] != 2 or val(x).dtype != torch.float32:
                continue
            _replace(gm, node, aten.rms_norm.default, (x, [int(val(x).shape[-1])], None, add[1]))
            break


def empty_concatenations(gm: fx.GraphModule) -> None:
    """In ``gm``, the inputs of ``cat`` that hold nothing (a dynamic KV cache's empty start:
    ``cat([empty, k], -2)``) dropped: ggml holds no empty tensor, so they kept the ``cat`` in
    torch."""
    for node in gm.graph.nodes:
        a = _call(node, torch.ops.aten.cat.default)
        if a is None or not isinstance(a[0], (list, tuple)):
            continue
        kept = [x for x in a[0] if not (isinstance(x, fx.Node) and isinstance(v := val(x), torch.Tensor)
                                        and v.dim() > 0 and statically_known_true(v.numel() == 0))]
        if kept and len(kept) < len(a[0]):
            node.args = (kept, *a[1:])


def _call(n: Any, *targets: Any) -> list[Any] | None:
    """``n``'s arguments if it is a call of one of ``targets``, else None."""
    return args_of(n) if isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets else None


def _rope_tables(x: fx.Node, c: Any, s: Any) -> tuple[fx.Node, Any, float] | None:
    """(positions, inv_freq, scale) when ``c`` and ``s`` are the cos and sin tables of the
    rotary embedding of ``x`` (B, H, T, D) as transformers makes them:
    ``unsqueeze(cos(e) * scale, 1)`` and ``unsqueeze(sin(e) * scale, 1)``, ``e = cat([f, f], -1)``,
    ``f = positions.float() * inv_freq`` with integer positions of shape (1, T, 1) and
    float32 ``inv_freq`` of shape (D / 2,); else None."""
    aten = torch.ops.aten
    xv = val(x)
    if not isinstance(xv, torch.Tensor) or xv.dim() != 4 or xv.dtype != torch.float32:
        return None
    D = xv.shape[-1]
    if not isinstance(D, int) or D % 2:
        return None
    found = []
    for table, fn in ((c, aten.cos.default), (s, aten.sin.default)):
        u = _call(table, aten.unsqueeze.default)
        if u is None or u[1] != 1:
            return None
        t, scale = u[0], 1.0
        m = _call(t, aten.mul.Tensor)
        if m is not None and isinstance(m[1], (int, float)) and not isinstance(m[1], bool):
            t, scale = m[0], float(m[1])
        e = _call(t, fn)
        if e is None:
            return None
        found.append((e[0], scale))
    (e_c, scale), (e_s, scale_s) = found
    cat = _call(e_c, aten.cat.default)
    if e_c is not e_s or scale != scale_s or cat is None or len(cat[0]) != 2 or cat[0][0] is not cat[0][1] \
            or (len(cat) > 1 and cat[1] not in (-1, 2)):
        return None
    f = _call(cat[0][0], aten.mul.Tensor)
    if f is None or len(f) != 2:
        return None
    for p, inv in ((f[0], f[1]), (f[1], f[0])):
        cast = _call(p, aten._to_copy.default)
        if cast is None or set(kw_of(p)) != {"dtype"} or kw_of(p)["dtype"] != torch.float32:
            continue
        pos, iv = val(cast[0]), val(inv)
        if not (isinstance(pos, torch.Tensor) and isinstance(iv, torch.Tensor)) or pos.is_floating_point() \
                or pos.dtype == torch.bool or pos.dim() != 3 or iv.dtype != torch.float32 or iv.dim() != 1:
            continue
        if statically_known_true(pos.shape[0] == 1) and statically_known_true(pos.shape[2] == 1) \
                and statically_known_true(pos.shape[1] == xv.shape[2]) and statically_known_true(iv.shape[0] * 2 == D):
            return cast[0], inv, scale
    return None


def rotary_embeddings(gm: fx.GraphModule) -> None:
    """In ``gm``, each rotary embedding written as transformers' ``apply_rotary_pos_emb`` does,
    ``x * cos + cat([-x2, x1], -1) * sin`` (``x1``, ``x2`` the halves of ``x``'s last dim),
    whose tables come from the frequency formula (:func:`_rope_tables`), written as
    ``torch.ops.pyggml.rope(x, positions, inv_freq, scale)``: one ``ggml_rope_ext`` instead of
    seven ggml ops per query and key. Matched with ``torch.fx.subgraph_rewriter``, a pattern for
    each split point of the graph's slices; the tables' nodes, read by nothing else, are
    dropped by :func:`rewrite`'s dead-code elimination."""
    splits = sorted({(a[1], a[2]) for n in gm.graph.nodes
                     if (a := _call(n, torch.ops.aten.slice.Tensor)) is not None and len(a) == 4
                     and isinstance(a[1], int) and isinstance(a[2], int) and a[2] > 0 and a[3] == sys.maxsize})
    for dim, h in splits:
        for cat_dim in sorted({-1, dim}):
            tables: dict[fx.Node, tuple[fx.Node, Any, float]] = {}
            for r in replace_pattern_with_filters(gm, _rotate_half_pattern(dim, h, cat_dim), _rope_replacement,
                                                  [_proven_tables(dim, h, tables)]):
                new, old = r.replacements[-1], r.nodes_map[r.anchor]
                positions, inv, scale = tables[old]
                new.args = (new.args[0], positions, inv, scale)
                new.meta = dict(old.meta)


def _rotate_half_pattern(dim: int, h: int, cat_dim: int) -> Any:
    """``x * c + cat([-x[h:], x[:h]], cat_dim) * s`` along ``dim``, in ATen ops (a pattern)."""
    aten = torch.ops.aten

    def pattern(x: Any, c: Any, s: Any) -> Any:
        first = aten.slice.Tensor(x, dim, 0, h)
        second = aten.slice.Tensor(x, dim, h, sys.maxsize)
        rotated = aten.cat.default([aten.neg.default(second), first], cat_dim)
        return aten.add.Tensor(aten.mul.Tensor(x, c), aten.mul.Tensor(rotated, s))
    return pattern


def _rope_replacement(x: Any, c: Any, s: Any) -> Any:
    return torch.ops.pyggml.rope.default(x, c, s, 1.0)   # the arguments are set after the match


def _proven_tables(dim: int, h: int, tables: dict[fx.Node, tuple[fx.Node, Any, float]]) -> Any:
    """A match filter: the split is ``x``'s last dim in halves and ``c``, ``s`` the tables of
    :func:`_rope_tables`, which it records in ``tables`` by the match's last node."""
    def proven(match: Any, graph: fx.Graph, pattern_graph: fx.Graph) -> bool:
        x, c, s = (match.nodes_map[p] for p in pattern_graph.nodes if p.op == "placeholder")
        xv = val(x)
        if not isinstance(xv, torch.Tensor) or dim % xv.dim() != xv.dim() - 1 or xv.shape[-1] != 2 * h:
            return False
        found = _rope_tables(x, c, s)
        if found is not None:
            tables[match.nodes_map[match.anchors[0]]] = found
        return found is not None
    return proven


def mark_in_place(gm: fx.GraphModule, mutated: dict[int, int]) -> None:
    """Mark (``node.meta[IN_PLACE]``) each ``index_put`` node of ``gm`` that may write into
    its ``self`` input's own memory: ``mutated`` maps the graph's output positions to the
    placeholder positions whose new value they are (AOT autograd's input mutations, copied
    back into those inputs after the graph), and ``self`` is that placeholder, read by this node
    only. The partitions keep the mark (FX copies ``meta``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for k, i in mutated.items():
        node = outs[k] if k < len(outs) else None
        if (isinstance(node, fx.Node) and node.target == torch.ops.aten.index_put.default
                and node.args[0] is placeholders[i] and len(placeholders[i].users) == 1):
            node.meta[IN_PLACE] = True
